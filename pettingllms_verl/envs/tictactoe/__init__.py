"""Tic-Tac-Toe: two players, or one against a scripted opponent. Rules in ``env.py``, wording and parsing in ``prompts.py``."""
