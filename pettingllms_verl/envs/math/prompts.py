"""Prompts of the math team: a tool agent that computes with Python, a reasoner that answers.

Replies are parsed with ``text.extract_code`` (tool) and ``text.last_boxed`` (reasoner).
"""

from __future__ import annotations

from pettingllms_verl.envs.text import MAX_TOOL_CODE_CHARS, Messages, cut, tool_section

TOOL_SYSTEM = (
    "You are the tool agent of a math team. Write a short Python program in one ```python block that "
    "computes the answer to the problem and prints it on the last line of its output. It runs in a "
    "sandbox with a few seconds of CPU and no input; the reasoner sees the program and its output."
)
REASONER_SYSTEM = "Solve the math problem. Put the final answer in \\boxed{}, e.g. \\boxed{42}."


def tool_messages(problem: str, last_code: str | None, last_answer: str | None, reasoner_answer: str | None) -> Messages:
    """From the second turn on, the tool sees its last program, its answer and the reasoner's."""
    user = f"Problem:\n{problem}"
    if last_code is not None:
        user += (
            f"\n\nYour last program:\n```python\n{cut(last_code, MAX_TOOL_CODE_CHARS)}\n```\n"
            f"Its answer: {last_answer or '(none)'}. The reasoner answered: {reasoner_answer or '(none)'}. "
            "They disagree: check the computation."
        )
    return [{"role": "system", "content": TOOL_SYSTEM}, {"role": "user", "content": user + "\n\nWrite the program."}]


def reasoner_messages(problem: str, tool_code: str | None, tool_output: str | None, last_answer: str | None) -> Messages:
    """The tool section appears once a tool has run (never in SA)."""
    user = f"Problem:\n{problem}"
    if tool_code is not None:
        user += tool_section(tool_code, tool_output)
    if last_answer is not None:
        user += f"\n\nYour last answer was \\boxed{{{last_answer}}}; the tool disagreed."
    return [{"role": "system", "content": REASONER_SYSTEM}, {"role": "user", "content": user}]
