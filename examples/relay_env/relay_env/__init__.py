"""Word relay, a two-role environment for pettingllms-verl that lives in its own package.

A describer sees a secret word among a few choices and writes a clue; a guesser sees only the clue
and the choices and names the word. Rules in ``env.py``, wording and parsing in ``prompts.py``, a
reward of the user's own for one role in ``rewards.py``, the data in ``data_prep.py``.
"""
