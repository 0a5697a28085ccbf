"""Prompts of the coding team: a tester that writes unit tests, a coder that writes the program.

Replies are parsed with ``text.parse_io_tests`` (tester) and ``text.extract_code`` (coder).
"""

from __future__ import annotations

from collections.abc import Sequence

from pettingllms_verl.envs.text import MAX_TOOL_CODE_CHARS, Messages, cut

MAX_SHOWN_MISMATCHES = 3
MAX_SHOWN_TEXT_CHARS = 200

CODER_SYSTEM = (
    "You are the coder of a programming team. Write a complete Python 3 program in one ```python block "
    "that reads the input from stdin and prints the answer to stdout."
)
CODER_SYSTEM_FUNCTION = (
    "You are the coder of a programming team. Write the Python 3 function the problem describes, whole "
    "(with its imports and helpers), in one ```python block. Tests call the function; nothing is read from stdin."
)


def tester_system(max_tests: int, function: bool = False) -> str:
    if function:
        form = "<input>\na call of the function\n</input>\n<output>\nthe value it must return, as a Python literal\n</output>"
        subject = "function is called with them"
    else:
        form, subject = "<input>\nstdin\n</input>\n<output>\nexpected stdout\n</output>", "program is run on them"
    return (
        f"You are the tester of a programming team. Write up to {max_tests} unit tests for the problem, "
        f"each as {form}. The coder's {subject}; a test whose expected output is wrong counts against you."
    )


def _tests_text(tests: Sequence[tuple[str, str]]) -> str:
    return "\n".join(f"<input>\n{stdin}</input>\n<output>\n{stdout}</output>" for stdin, stdout in tests)


def _mismatches_text(mismatches: Sequence[dict]) -> str:
    lines = [f"The program failed {len(mismatches)} of the tester's tests:"]
    for m in mismatches[:MAX_SHOWN_MISMATCHES]:
        lines.append(
            f"input: {cut(m['input'], MAX_SHOWN_TEXT_CHARS)!r} expected: {cut(m['expected'], MAX_SHOWN_TEXT_CHARS)!r} "
            f"got: {cut(m['got'], MAX_SHOWN_TEXT_CHARS)!r}"
        )
    return "\n".join(lines)


def _history(code: str | None, mismatches: Sequence[dict]) -> str:
    if code is None:
        return ""
    text = f"\n\nThe coder's last program:\n```python\n{cut(code, MAX_TOOL_CODE_CHARS)}\n```"
    return text + (f"\n{_mismatches_text(mismatches)}" if mismatches else "")


def tester_messages(problem: str, max_tests: int, code: str | None, mismatches: Sequence[dict], function: bool = False) -> Messages:
    user = f"Problem:\n{problem}{_history(code, mismatches)}\n\nWrite the tests."
    return [{"role": "system", "content": tester_system(max_tests, function)}, {"role": "user", "content": user}]


def coder_messages(
    problem: str, tests: Sequence[tuple[str, str]], code: str | None, mismatches: Sequence[dict], function: bool = False
) -> Messages:
    """The tester's tests appear once a tester has written some (never in SA); ``function``: a
    problem of the HumanEval kind (the coder writes a function that tests call)."""
    user = f"Problem:\n{problem}"
    if tests:
        user += f"\n\nThe tester's tests:\n{cut(_tests_text(tests), MAX_TOOL_CODE_CHARS)}"
    user += _history(code, mismatches) + ("\n\nWrite the function." if function else "\n\nWrite the program.")
    return [{"role": "system", "content": CODER_SYSTEM_FUNCTION if function else CODER_SYSTEM}, {"role": "user", "content": user}]
