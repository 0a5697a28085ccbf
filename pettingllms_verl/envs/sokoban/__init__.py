"""Sokoban: a tool agent and a plan agent push every box onto a target. Rules and level generator in ``env.py``, wording in ``prompts.py``."""
