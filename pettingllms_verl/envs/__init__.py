"""Environments by name: ``make(name, **config)``.

A name is found, in order: in the table below and what ``register_env`` added (a recipe's
``pettingllms.envs`` is registered so in every rollout worker); among the entry points of the
group ``pettingllms_verl.envs`` that installed packages declare; as ``module:Class`` itself.
"""

from __future__ import annotations

import functools
from importlib.metadata import entry_points

from pettingllms_verl.envs.base import Env, StepResult, Workflow
from pettingllms_verl.envs.text import Messages
from pettingllms_verl.targets import load_target

ENTRY_POINT_GROUP = "pettingllms_verl.envs"  # packages declare their environments here: name = "module:Class"

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
    """Make ``make(name)`` build ``target`` (``"package.module:ClassName"`` or ``"file.py:ClassName"``)."""
    _ENVS[name] = target


@functools.cache  # read once per process: make() runs per episode
def declared() -> dict[str, str]:
    """The environments installed packages declare: name -> "module:Class" (entry-point group
    ``pettingllms_verl.envs``)."""
    return {entry.name: entry.value for entry in entry_points(group=ENTRY_POINT_GROUP)}


def available() -> list[str]:
    """The shipped environments and those registered in this process (not installed packages'
    entry points: see ``declared``), so what is built from this list (the tiny model's corpus,
    ``--envs all``) does not depend on what else is installed."""
    return sorted(_ENVS)


def env_class(name: str) -> type[Env]:
    """The class ``make(name)`` builds; ``KeyError`` for an unknown name, ``TypeError`` for a non-Env."""
    target = _ENVS.get(name) or declared().get(name) or (name if ":" in name else None)
    if target is None:
        known = sorted({*available(), *declared()})
        raise KeyError(
            f"unknown environment {name!r}; available: {', '.join(known) or '<none>'} (your own: name it in "
            f"pettingllms.envs.<name>='module:Class', or declare it in the entry-point group {ENTRY_POINT_GROUP!r})"
        )
    cls = load_target(target)
    if not (isinstance(cls, type) and issubclass(cls, Env)):
        raise TypeError(f"environment {name!r}: {target!r} is {cls!r}, not a subclass of pettingllms_verl.envs.Env")
    return cls


class UnknownEnvOption(ValueError):
    """``make`` got an option its environment does not declare (``option`` names it)."""

    def __init__(self, env: str, option: str, options: dict[str, str]):
        known = "; ".join(f"{key}: {help}" for key, help in sorted(options.items())) or "none"
        super().__init__(f"{env}: unknown option {option!r}; its options are {known}")
        self.option = option


def make(name: str, **config) -> Env:
    """Build the environment registered as ``name`` (not yet reset)."""
    cls = env_class(name)
    unknown = sorted(set(config) - set(cls.options))
    if unknown:
        raise UnknownEnvOption(name, unknown[0], cls.options)
    return cls(**config)


__all__ = [
    "ENTRY_POINT_GROUP", "Env", "Messages", "StepResult", "UnknownEnvOption", "Workflow", "available", "declared", "env_class",
    "make", "register_env",
]
