"""Code: a tester that writes unit tests and a coder that writes the program. Rules in ``env.py``, wording in ``prompts.py``."""
