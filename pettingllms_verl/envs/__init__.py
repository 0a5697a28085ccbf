"""Environments by name: ``make(name, **config)``."""

from __future__ import annotations

import importlib

from pettingllms_verl.envs.base import Env, StepResult, Workflow
from pettingllms_verl.envs.text import Messages

# name -> "module:Class"; modules are imported on first use so a missing optional dependency of
# one environment never breaks another.
_ENVS: dict[str, str] = {
    "plan_path": "pettingllms_verl.envs.plan_path.env:PlanPathEnv",
    "sokoban": "pettingllms_verl.envs.sokoban.env:SokobanEnv",
    "sudoku": "pettingllms_verl.envs.sudoku.env:SudokuEnv",
    "tictactoe": "pettingllms_verl.envs.tictactoe.env:TicTacToeEnv",
    "hanabi": "pettingllms_verl.envs.hanabi.env:HanabiEnv",
    "math": "pettingllms_verl.envs.math.env:MathEnv",
    "code": "pettingllms_verl.envs.code.env:CodeEnv",
}


def register_env(name: str, target: str) -> None:
    """Make ``make(name)`` build ``target`` (``"package.module:ClassName"``)."""
    _ENVS[name] = target


def available() -> list[str]:
    return sorted(_ENVS)


class UnknownEnvOption(ValueError):
    """``make`` got an option its environment does not declare (``option`` names it)."""

    def __init__(self, env: str, option: str, options: dict[str, str]):
        known = "; ".join(f"{key}: {help}" for key, help in sorted(options.items())) or "none"
        super().__init__(f"{env}: unknown option {option!r}; its options are {known}")
        self.option = option


def make(name: str, **config) -> Env:
    """Build the environment registered as ``name`` (not yet reset)."""
    if name not in _ENVS:
        raise KeyError(f"unknown environment {name!r}; available: {', '.join(available()) or '<none>'}")
    module_name, class_name = _ENVS[name].split(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    unknown = sorted(set(config) - set(cls.options))
    if unknown:
        raise UnknownEnvOption(name, unknown[0], cls.options)
    return cls(**config)


__all__ = ["Env", "Messages", "StepResult", "UnknownEnvOption", "Workflow", "available", "make", "register_env"]
