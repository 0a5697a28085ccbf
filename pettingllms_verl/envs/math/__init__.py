"""Math: a tool agent that computes and a reasoner that answers. Rules in ``env.py``, wording in ``prompts.py``, answer equivalence in ``grading.py``."""
