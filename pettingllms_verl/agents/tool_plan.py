"""Prompts of the tool/plan team that plays grid puzzles (Plan-Path, Sokoban, Sudoku).

The **tool** agent writes a Python program that reads the current state as JSON on stdin and
prints an action list; the **plan** agent sees the state and, in the multi-agent workflow, the
tool's last program and output, and answers with the actions that are applied. Each puzzle
supplies a ``PuzzlePrompts``; this module only assembles messages, so wording stays in one place.
Prompts are kept short: tiny models have small contexts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from pettingllms_verl.envs.base import Messages

# What the plan agent sees of the tool's work; longer text is cut (tiny contexts).
MAX_TOOL_CODE_CHARS = 1500
MAX_TOOL_OUTPUT_CHARS = 400


@dataclass(frozen=True)
class PuzzlePrompts:
    """Puzzle-specific wording.

    rules: the puzzle and its actions, for both roles.
    answer_format: how the plan agent writes its final actions.
    output_format: what the tool's program must print.
    state_schema: the JSON the tool's program receives on stdin.
    render: the current state (the env's ``view()`` dict) as text for the prompt.
    """

    rules: str
    answer_format: str
    output_format: str
    state_schema: str
    render: Callable[[dict], str]


def tool_messages(prompts: PuzzlePrompts, view: dict) -> Messages:
    system = (
        f"{prompts.rules}\n\nYou are the tool agent. Write a short Python program in one ```python block. "
        f"It reads the current state from stdin as JSON: {prompts.state_schema}. "
        f"It must print {prompts.output_format}. It runs in a sandbox with a few seconds of CPU; "
        "its answer is tried on a copy of the puzzle and shown to the plan agent."
    )
    return [
        {"role": "system", "content": system},
        {"role": "user", "content": f"{prompts.render(view)}\n\nWrite the program."},
    ]


def plan_messages(prompts: PuzzlePrompts, view: dict, tool_code: str | None, tool_output: str | None) -> Messages:
    """Plan agent's messages; the tool section appears only once a tool has run (never in SA)."""
    user = prompts.render(view)
    if tool_code is not None:
        user += tool_section(tool_code, tool_output)
    return [
        {"role": "system", "content": f"{prompts.rules}\n\n{prompts.answer_format}"},
        {"role": "user", "content": user},
    ]


def tool_section(tool_code: str, tool_output: str | None) -> str:
    """The tool agent's last program and output as another agent is shown them (cut to fit)."""
    return (
        f"\n\nThe tool agent's program:\n```python\n{cut(tool_code, MAX_TOOL_CODE_CHARS)}\n```\n"
        f"Its output:\n{cut(tool_output or '(nothing)', MAX_TOOL_OUTPUT_CHARS)}"
    )


def cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "\n...(cut)"
