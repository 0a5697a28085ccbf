"""Hanabi for two cooperating players. Rules in ``env.py``, wording and action parsing in ``prompts.py``."""
