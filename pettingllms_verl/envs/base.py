"""The environment contract: what every environment implements (this module is its reference).

An environment is pure Python and deterministic given its seed. It speaks text at its edge
(chat messages out, a model's reply in) but never calls a model. Each environment is a package
``envs/<name>/``: ``env.py`` decides what a parsed action does to the state and what it is worth;
``prompts.py`` holds what each role is shown and how its replies are read (with the shared parsers
of ``envs.text``). This module and ``text`` are shared and import nothing of any environment.
"""

from __future__ import annotations

import abc
import json
from collections import Counter
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any, ClassVar

from pettingllms_verl.envs.text import Messages

# Rewards and limits common to the environments whose replies are parsed or run as programs.
PARSE_PENALTY = -0.5  # a reply with nothing readable in it (the state is unchanged)
TOOL_FAILURE_PENALTY = -0.25  # a tool program that crashes, times out, or prints nothing usable
# Sandbox limits of a tool agent's program; the env option "tool_limits" overrides them.
DEFAULT_TOOL_LIMITS = {"wall_s": 5.0, "cpu_s": 3, "memory_mb": 512, "max_output_bytes": 16_384}


@dataclass(frozen=True)
class Workflow:
    """Who acts, in which order, for how many turns."""

    turn_order: tuple[str, ...]
    max_turns: int


@dataclass
class StepResult:
    """What one role's reply earned.

    local_reward: the acting role's own reward for this reply.
    parse_ok: False when the reply could not be parsed (the state is then unchanged and
        ``local_reward`` holds the environment's fixed parse penalty).
    info: free-form, JSON-serialisable diagnostics (e.g. sandbox status, moves applied); under
        ``SANDBOX_RUNS``, the statuses of the sandbox runs this reply caused (see ``sandbox_runs``).
    """

    local_reward: float
    parse_ok: bool = True
    info: dict[str, Any] = field(default_factory=dict)


SANDBOX_RUNS = "sandbox_runs"  # StepResult.info key: {sandbox status: runs} of this reply's programs


def sandbox_runs(statuses) -> dict[str, dict[str, int]]:
    """``info`` entry counting a reply's sandbox runs by status ("ok", "timeout", "killed", ...)."""
    return {SANDBOX_RUNS: dict(Counter(statuses))}


class Env(abc.ABC):
    """Base class of every environment.

    Subclasses set ``name`` and ``roles`` and implement the abstract methods. ``clone`` must
    return a fully independent copy: stepping a clone never changes its parent or siblings.
    """

    name: ClassVar[str]
    roles: ClassVar[tuple[str, ...]]
    # option -> one-line help: the keyword options ``make(name, **options)`` accepts (any other is
    # refused there, naming these: a misspelt option must not silently fall back to its default)
    options: ClassVar[dict[str, str]] = {}
    # True where a role's replies are run as code (in the sandbox): the preflight then checks, before
    # Ray starts, that this machine isolates such code (or that the user opted out)
    runs_model_code: ClassVar[bool] = False
    # True once the episode ended on the env's own turn limit, not by its rules (a win, a loss, a
    # solved task): the runner then reports it as cut short (``max_turns``). An env with a turn limit
    # of its own overrides it, as a property of its state or set where it sets ``done`` (and cleared
    # in ``reset``); without one, an episode the env ended counts as finished by its rules
    truncated: bool = False

    def __init__(self, **config: Any) -> None:
        self.config = config
        self.done = False
        self.success = False

    @abc.abstractmethod
    def reset(self, seed: int, task: dict | None = None) -> None:
        """Start an episode: from ``task`` when given, else a task generated from ``seed``."""

    @property
    @abc.abstractmethod
    def task(self) -> dict:
        """JSON-serialisable dict that recreates this episode with ``reset(seed, task)``."""

    @property
    @abc.abstractmethod
    def global_reward(self) -> float:
        """Team reward of the current state (shared by every role)."""

    @abc.abstractmethod
    def observation(self, role: str) -> Messages:
        """Chat messages (``[{"role": "system"|"user", "content": ...}]``) for ``role``'s next reply."""

    @abc.abstractmethod
    def step(self, role: str, text: str) -> StepResult:
        """Apply ``role``'s reply. Never raises on any ``text``."""

    def clone(self) -> Env:
        """An independent copy of the current state (cheap: no deep copy of shared config).

        This default copies ``__dict__`` shallowly, which is independent while every per-episode
        field is immutable (str, int, tuple, None) and per-task tables are never mutated; an env
        with a mutable field overrides it and copies that field too."""
        twin = object.__new__(type(self))
        twin.__dict__ = self.__dict__.copy()
        return twin

    @abc.abstractmethod
    def workflow(self, mode: str) -> Workflow:
        """The workflow of ``mode``: ``"sa"`` (one agent) or ``"mas"`` (several roles)."""

    def position_value(self, role: str) -> float | None:
        """``role``'s outcome reward if every role played perfectly from the current state (the
        game-theoretic value, in the units of the env's own outcome rewards), or None: the env has
        no such value (the default). A K-branch tree adds it to the role reward of each branch whose
        reply leaves the game going, so that a move is credited with the outcome it allows on another
        role's reply (``episodes.core.branch_value``; a reply that ends the game has its own)."""
        return None

    def snapshot(self) -> dict[str, Any]:
        """The whole current state as JSON-serialisable data, for episode logs and the episode
        viewer (not shown to a model; ``{}``: nothing beyond the prompts and replies)."""
        return {}

    def unknown_role(self, role: Any) -> ValueError:
        """The error to raise for a role this env does not have."""
        return ValueError(f"{self.name} has no role {role!r}; roles: {self.roles}")

    def check_role(self, role: Any) -> None:
        if role not in self.roles:
            raise self.unknown_role(role)


def workflow_for(mode: str, mas: tuple[str, ...], sa: tuple[str, ...], max_turns: int) -> Workflow:
    """An env's workflow of ``mode``: its MAS or SA turn order, with one turn budget for both."""
    orders = {"mas": mas, "sa": sa}
    if mode not in orders:
        raise ValueError(f"unknown workflow mode {mode!r}; use 'sa' or 'mas'")
    return Workflow(orders[mode], max_turns)


IGNORED = "ignored"  # StepResult.info key of a reply the env ignored, with the reason


def ignored(reason: str) -> StepResult:
    """The result of a reply that changes nothing and earns nothing (episode over, not the role's turn)."""
    return StepResult(0.0, True, {IGNORED: reason})


@cache
def fixture_tasks(filename: str) -> tuple[dict, ...]:
    """An offline task set shipped with the package (``pettingllms_verl/data/<filename>``, JSONL)."""
    text = resources.files("pettingllms_verl.data").joinpath(filename).read_text()
    return tuple(json.loads(line) for line in text.splitlines() if line.strip())


def fixture_task(filename: str, seed: int) -> dict:
    """Task ``seed % N`` of a shipped task set (what ``reset(seed)`` plays without a task)."""
    tasks = fixture_tasks(filename)
    return tasks[seed % len(tasks)]
