"""Sudoku 4x4: a tool agent and a plan agent fill the grid. Rules and puzzle generator in ``env.py``, wording and parsing in ``prompts.py``."""
