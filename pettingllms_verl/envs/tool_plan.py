"""Shared base of the grid puzzles played by a tool agent and a plan agent.

Roles: ``tool`` writes Python that prints an action list; it runs in the sandbox with the current
state (``view()``) as JSON on stdin, and its actions are scored on a *clone*, never applied.
``plan`` answers with the actions that are applied. Workflows over the same turn budget:
``mas`` = tool then plan each turn; ``sa`` = plan alone (it never sees tool output).

Rewards common to every puzzle:
- ``PARSE_PENALTY`` for a reply without a readable action list (plan) or without a ```python
  block (tool); the puzzle state is unchanged.
- tool: what its printed actions would earn on a clone, or ``TOOL_FAILURE_PENALTY`` when the
  program crashes, times out, is killed, prints too much, or prints no readable action list.
- plan: what its actions earn when applied (each puzzle defines the per-action rewards).
A plan reply ends a turn (parsed or not); the episode is done when solved or after
``max_turns`` turns. Replies after that are ignored (reward 0).

Shared by the three puzzles (not an environment itself): the turn flow and rewards above, and the
prompt template each puzzle fills with its own wording (``PuzzlePrompts``, in its ``prompts.py``).
Cloning is ``Env``'s shallow copy of ``__dict__``: subclasses keep every per-episode field
immutable (ints, tuples, strings) and never mutate the per-task tables they share with their
clones, so the copy is independent and costs about a microsecond.
"""

from __future__ import annotations

import abc
import json
from dataclasses import dataclass
from typing import Any, ClassVar
from collections.abc import Callable

from pettingllms_verl.envs.base import (
    DEFAULT_TOOL_LIMITS, PARSE_PENALTY, TOOL_FAILURE_PENALTY, Env, StepResult, Workflow, ignored, sandbox_runs, workflow_for,
)
from pettingllms_verl.envs.images import image_part
from pettingllms_verl.envs.text import Messages, extract_code, tool_section
from pettingllms_verl.sandbox import SandboxLimits, run_python


@dataclass(frozen=True)
class PuzzlePrompts:
    """Puzzle-specific wording.

    rules: the puzzle and its actions, for both roles.
    answer_format: how the plan agent writes its final actions.
    output_format: what the tool's program must print.
    state_schema: the JSON the tool's program receives on stdin.
    render: the current state (the env's ``view()`` dict) as text for the prompt.
    draw: the current state as an image (``envs/images.py``), shown in place of the text to the
        roles of the env option ``image_roles``; None: the puzzle draws none.
    caption: the text beside the image: what its colours mean, and the rest of ``render``.
    """

    rules: str
    answer_format: str
    output_format: str
    state_schema: str
    render: Callable[[dict], str]
    draw: Callable[[dict], Any] | None = None
    caption: Callable[[dict], str] | None = None

    def state(self, view: dict, image: bool) -> str | list[dict]:
        """The state as a message content: its text, or its image and caption."""
        if not image:
            return self.render(view)
        return [image_part(self.draw(view)), {"type": "text", "text": self.caption(view)}]


def append_text(content: str | list[dict], text: str) -> str | list[dict]:
    """``text`` added at the end of a message content (a string, or parts ending in a text part)."""
    if isinstance(content, str):
        return content + text
    return [*content[:-1], {"type": "text", "text": content[-1]["text"] + text}]


def tool_messages(prompts: PuzzlePrompts, view: dict, image: bool = False) -> Messages:
    system = (
        f"{prompts.rules}\n\nYou are the tool agent. Write a short Python program in one ```python block. "
        f"It reads the current state from stdin as JSON: {prompts.state_schema}. "
        f"It must print {prompts.output_format}. It runs in a sandbox with a few seconds of CPU; "
        "its answer is tried on a copy of the puzzle and shown to the plan agent."
    )
    return [
        {"role": "system", "content": system},
        {"role": "user", "content": append_text(prompts.state(view, image), "\n\nWrite the program.")},
    ]


def plan_messages(prompts: PuzzlePrompts, view: dict, tool_code: str | None, tool_output: str | None, image: bool = False) -> Messages:
    """Plan agent's messages; the tool section appears only once a tool has run (never in SA)."""
    user = prompts.state(view, image)
    if tool_code is not None:
        user = append_text(user, tool_section(tool_code, tool_output))
    return [
        {"role": "system", "content": f"{prompts.rules}\n\n{prompts.answer_format}"},
        {"role": "user", "content": user},
    ]


class ToolPlanEnv(Env):
    roles: ClassVar[tuple[str, ...]] = ("tool", "plan")
    runs_model_code: ClassVar[bool] = True
    prompts: ClassVar[PuzzlePrompts]
    default_max_turns: ClassVar[int]

    options = {
        "max_turns": "turns per episode (each turn: every role of the workflow acts once)",
        "tool_limits": "sandbox limits of the tool agent's programs (SandboxLimits fields)",
    }
    # the option of puzzles that draw their state (PuzzlePrompts.draw); added to such a puzzle's options
    IMAGE_ROLES = {"image_roles": "roles shown the state as an image instead of its text grid (a vision-language model's roles)"}

    def __init__(self, **config: Any) -> None:
        super().__init__(**config)
        self.max_turns = int(config.get("max_turns", self.default_max_turns))
        self.tool_limits = SandboxLimits(**{**DEFAULT_TOOL_LIMITS, **config.get("tool_limits", {})})
        self.image_roles = frozenset(config.get("image_roles") or ())
        unknown = sorted(self.image_roles - set(self.roles))
        if unknown:
            raise ValueError(f"{self.name}: image_roles names {unknown}, not roles of this environment ({', '.join(self.roles)})")

    # --- puzzle-specific -------------------------------------------------------------------

    @abc.abstractmethod
    def view(self) -> dict:
        """The current state as a JSON-able dict: the tool's stdin and what prompts render."""

    def snapshot(self) -> dict:
        return self.view()

    @abc.abstractmethod
    def parse_actions(self, text: str) -> Any | None:
        """Actions in ``text`` (a plan reply or a tool's stdout), or None when there are none."""

    @abc.abstractmethod
    def apply(self, actions: Any) -> tuple[float, dict]:
        """Apply parsed actions to this state; (reward, info). Sets ``success`` when solved."""

    # --- shared ----------------------------------------------------------------------------

    def _begin_episode(self) -> None:
        self.done = False
        self.success = False
        self.turn = 0
        self.tool_code: str | None = None
        self.tool_output: str | None = None

    @property
    def truncated(self) -> bool:
        return self.turn >= self.max_turns and not self.success

    def workflow(self, mode: str) -> Workflow:
        return workflow_for(mode, mas=("tool", "plan"), sa=("plan",), max_turns=self.max_turns)

    def observation(self, role: str) -> Messages:
        if role == "tool":
            return tool_messages(self.prompts, self.view(), role in self.image_roles)
        if role == "plan":
            return plan_messages(self.prompts, self.view(), self.tool_code, self.tool_output, role in self.image_roles)
        raise self.unknown_role(role)

    def step(self, role: str, text: str) -> StepResult:
        self.check_role(role)
        if self.done:
            return ignored("episode is done")
        if role == "tool":
            return self._tool_step(text)
        actions = self.parse_actions(text)
        if actions is None:
            result = StepResult(PARSE_PENALTY, False, {})
        else:
            reward, info = self.apply(actions)
            result = StepResult(reward, True, info)
        self.turn += 1
        self.done = self.done or self.success or self.turn >= self.max_turns
        return result

    def _tool_step(self, text: str) -> StepResult:
        code = extract_code(text)
        if code is None:
            return StepResult(PARSE_PENALTY, False, {"tool_status": "no_code"})
        run = run_python(code, stdin=json.dumps(self.view()), limits=self.tool_limits)
        self.tool_code = code
        self.tool_output = run.transcript()
        ran = sandbox_runs([run.status])
        if not run.ok:
            return StepResult(TOOL_FAILURE_PENALTY, True, {"tool_status": run.status, **ran})
        actions = self.parse_actions(run.stdout)
        if actions is None:
            return StepResult(TOOL_FAILURE_PENALTY, True, {"tool_status": "no_actions", **ran})
        trial = self.clone()
        reward, info = trial.apply(actions)
        return StepResult(reward, True, {"tool_status": "ok", "would_solve": trial.success, **info, **ran})
