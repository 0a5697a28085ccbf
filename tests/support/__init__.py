"""Helpers the tests share (``pytest``'s ``pythonpath`` puts ``tests/`` on the path): launching
``main_ppo`` and reading what a run left. No test file imports another test file."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RECIPES = str(REPO / "recipes")  # --config-path for main_ppo: the recipes as a user's checkout has them
SUPPORT = Path(__file__).resolve().parent
