"""Plan-Path: a tool agent and a plan agent walk a grid to its goal. Rules in ``env.py``, wording and parsing in ``prompts.py``."""
