"""Text at the environments' edge, shared by all of them: the chat message type, the defensive
parsers of model replies, and how one agent's program is shown to another. Neutral: it imports
nothing of any environment.

Model output is hostile or broken as often as not: every function here returns ``None`` (or an
empty result) on anything it cannot read and never raises, whatever the text. Numbers longer than
``MAX_DIGITS`` are treated as unreadable, so a 10,000-digit "number" never reaches ``int()``
(which refuses more than 4,300 digits) or a range check.
"""

from __future__ import annotations

import re
from typing import Any
from collections.abc import Mapping

# chat messages: [{"role": "system" | "user" | "assistant", "content": str}]; a content may instead be a
# list of parts, {"type": "text", "text": str} and {"type": "image", "image": PIL.Image} (envs/images.py)
Messages = list[dict[str, Any]]

MAX_DIGITS = 6
# What an agent is shown of another's program and its output; longer text is cut (tiny contexts).
MAX_TOOL_CODE_CHARS = 1500
MAX_TOOL_OUTPUT_CHARS = 400

# Direction words and letters -> the moves U/D/L/R of the grid puzzles.
DIRECTION_ALIASES = {"u": "U", "up": "U", "d": "D", "down": "D", "l": "L", "left": "L", "r": "R", "right": "R"}

_THINK_RE = re.compile(r"<think>.*?(?:</think>|\Z)", re.DOTALL)
_ANSWER_RE = re.compile(r"<answer>(.*?)(?:</answer>|\Z)", re.DOTALL)
_INT_RE = re.compile(r"-?[0-9]+")
_WORD_RE = re.compile(r"[^\W\d_]+")
_ROW_LABEL_RE = re.compile(r"^\s*row\s*[0-9]+\s*[:=\-]", re.IGNORECASE)


def strip_think(text: str) -> str:
    """``text`` without ``<think>...</think>`` spans (an unclosed one runs to the end). A lone
    ``</think>`` (chat templates that open the span in the prompt) drops everything before it."""
    if "<think>" in text:
        text = _THINK_RE.sub("", text)
    if "</think>" in text:
        text = text.rpartition("</think>")[2]
    return text


def answer_text(text: str) -> str:
    """The content of the last ``<answer>...</answer>`` (an unclosed one runs to the end), else
    the whole reply; reasoning in ``<think>`` is dropped first."""
    text = strip_think(text)
    if "<answer>" not in text:
        return text
    return _ANSWER_RE.findall(text)[-1]


def extract_code(text: str, languages: tuple[str, ...] = ("python", "py", "python3", "")) -> str | None:
    """The last fenced code block whose language tag is in ``languages`` ("" = untagged).

    A final unclosed fence counts too: replies cut off by a token limit or a stop string often
    end inside the block.
    """
    # odd-numbered parts lie inside fences; with an odd number of fences the last one is open
    for block in reversed(strip_think(text).split("```")[1::2]):
        tag, _, code = block.partition("\n")
        if tag.strip().lower() in languages and code.strip():
            return code
    return None


def last_boxed(text: str, max_chars: int = 200) -> str | None:
    """The content of the last ``\\boxed{...}`` (braces balanced), stripped; None when there is
    none, it is unclosed or empty, or longer than ``max_chars``."""
    text = strip_think(text)
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, begin = 0, start + len("\\boxed{")
    for i in range(begin, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            if depth == 0:
                content = text[begin:i].strip()
                return content if 0 < len(content) <= max_chars else None
            depth -= 1
    return None


def parse_io_tests(text: str, max_tests: int, max_chars: int) -> list[tuple[str, str]]:
    """Unit tests written as ``<input>stdin</input><output>expected stdout</output>`` pairs, in
    order; at most ``max_tests``, and a pair with either part over ``max_chars`` is skipped. A pair
    is an ``<input>`` to its first ``</input>``, then (after whitespace) ``<output>`` to its first
    ``</output>``; one newline after either opening tag is not part of the text. One pass over the
    reply: a regex with lazy groups rescans the rest of it from every unpaired ``<input>``, quadratic
    on a degenerate reply of thousands of them."""
    text = strip_think(text)
    tests, at = [], 0
    while len(tests) < max_tests:
        start = text.find("<input>", at)
        close = text.find("</input>", start) if start >= 0 else -1
        if close < 0:
            break
        at = close + len("</input>")
        while at < len(text) and text[at].isspace():
            at += 1
        if not text.startswith("<output>", at):
            continue  # an input without its output: no test
        end = text.find("</output>", at)
        if end < 0:
            break
        stdin = text[start + len("<input>") : close].removeprefix("\n")
        stdout = text[at + len("<output>") : end].removeprefix("\n")
        at = end + len("</output>")
        if len(stdin) <= max_chars and len(stdout) <= max_chars:
            tests.append((stdin, stdout))
    return tests


def int_or_none(token: str) -> int | None:
    """``int(token)`` for a plain decimal of at most ``MAX_DIGITS`` digits, else None."""
    digits = token[1:] if token.startswith("-") else token
    if not digits.isascii() or not digits.isdigit() or len(digits) > MAX_DIGITS:
        return None
    return int(token)


def parse_moves(text: str, aliases: Mapping[str, str], max_moves: int) -> list[str] | None:
    """A move list such as ``U R R D``, ``["up", "right"]`` or ``URRD``.

    ``aliases`` maps lower-case words and single letters to canonical moves (e.g. ``"up": "U",
    "u": "U"``). Inside ``<answer>`` every word must be a move; without it, the last line made only
    of moves is taken, so chatter before the answer is ignored. A label up to the last ``:`` of
    the line is dropped (``Moves: R D``). Runs of single-letter moves
    (``URRD``) are split. At most ``max_moves`` moves are returned. None when no move list is found.
    """
    text = strip_think(text)
    if "<answer>" in text:
        return _moves_of_line(answer_text(text).replace("\n", " "), aliases, max_moves)
    for line in reversed(text.splitlines()):
        moves = _moves_of_line(line, aliases, max_moves)
        if moves:
            return moves
    return None


def _moves_of_line(line: str, aliases: Mapping[str, str], max_moves: int) -> list[str] | None:
    moves: list[str] = []
    for word in _WORD_RE.findall(line.rpartition(":")[2]):  # "Moves: R D" -> "R D"
        word = word.lower()
        move = aliases.get(word)
        if move is not None:
            moves.append(move)
        elif all(letter in aliases for letter in word):  # "urrd": a run of one-letter moves
            moves.extend(aliases[letter] for letter in word)
        else:
            return None
        if len(moves) >= max_moves:
            return moves[:max_moves]
    return moves or None


def parse_int_grid(text: str, rows: int, cols: int, lo: int, hi: int) -> list[list[int]] | None:
    """A ``rows`` x ``cols`` grid of ints in ``[lo, hi]``: JSON-style ``[[1,2],[3,4]]``, one row per
    line (``1 2`` / ``1,2`` / ``| 1 | 2 |``) or rows of single digits (``12``).

    The last block of ``rows`` consecutive rows wins. None when there is none.
    """
    run: list[list[int]] = []
    best = None
    # "]" ends a row in JSON style, a newline in every other style
    for line in answer_text(text).replace("]", "\n").splitlines():
        row = _grid_row(_ROW_LABEL_RE.sub("", line), cols, lo, hi)
        if row is None:
            if _INT_RE.search(line):  # a line with numbers that is not a row breaks the block
                run = []
            continue
        run.append(row)
        if len(run) >= rows:
            best = run[-rows:]
    return best


def _grid_row(line: str, cols: int, lo: int, hi: int) -> list[int] | None:
    tokens = _INT_RE.findall(line)
    if len(tokens) == 1 and len(tokens[0]) == cols and cols > 1:
        tokens = list(tokens[0])
    if len(tokens) != cols:
        return None
    row = [int_or_none(token) for token in tokens]
    if any(value is None or not lo <= value <= hi for value in row):
        return None
    return row


def parse_int_tuples(text: str, arity: int, max_items: int) -> list[tuple[int, ...]]:
    """Every bracketed tuple of ``arity`` ints, e.g. ``[1, 2, 3]`` or ``(1,2,3)``, in order (at most
    ``max_items``). Tuples holding an unreadable number are skipped; range checks are the caller's."""
    pattern = _tuple_pattern(arity)
    found: list[tuple[int, ...]] = []
    for match in pattern.finditer(answer_text(text)):
        values = tuple(int_or_none(group) for group in match.groups())
        if None not in values:
            found.append(values)  # type: ignore[arg-type]
            if len(found) >= max_items:
                break
    return found


_TUPLE_PATTERNS: dict[int, re.Pattern] = {}


def _tuple_pattern(arity: int) -> re.Pattern:
    if arity not in _TUPLE_PATTERNS:
        number = r"\s*(-?[0-9]+)\s*"
        _TUPLE_PATTERNS[arity] = re.compile(r"[\[(]" + ",".join([number] * arity) + r"[\])]")
    return _TUPLE_PATTERNS[arity]


def last_int(text: str, lo: int, hi: int) -> int | None:
    """The last integer of the answer, if it lies in ``[lo, hi]`` (e.g. a cell index)."""
    tokens = _INT_RE.findall(answer_text(text))
    if not tokens:
        return None
    value = int_or_none(tokens[-1])
    return value if value is not None and lo <= value <= hi else None


def cut(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, marked when cut."""
    return text if len(text) <= limit else text[:limit] + "\n...(cut)"


def tool_section(tool_code: str, tool_output: str | None) -> str:
    """The tool agent's last program and output as another agent is shown them (cut to fit)."""
    return (
        f"\n\nThe tool agent's program:\n```python\n{cut(tool_code, MAX_TOOL_CODE_CHARS)}\n```\n"
        f"Its output:\n{cut(tool_output or '(nothing)', MAX_TOOL_OUTPUT_CHARS)}"
    )
