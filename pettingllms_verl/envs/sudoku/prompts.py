"""Sudoku 4x4 prompts and reply parser (a full grid or [row, col, value] fills)."""

from __future__ import annotations

from pettingllms_verl.envs.text import parse_int_grid, parse_int_tuples
from pettingllms_verl.envs.tool_plan import PuzzlePrompts

SIZE = 4
MAX_FILLS = 64


def parse_fills(text: str) -> list[tuple[int, int, int]] | None:
    """Fills ``(row, col, value)`` from a full grid (its 0 cells skipped) or from bracketed triples.

    Range checks are left to the environment, which penalises out-of-range fills; None when the
    reply holds neither form.
    """
    grid = parse_int_grid(text, SIZE, SIZE, 0, SIZE)
    if grid is not None:
        return [(r, c, value) for r, row in enumerate(grid) for c, value in enumerate(row) if value]
    return parse_int_tuples(text, 3, MAX_FILLS) or None  # type: ignore[return-value]


def _rows(grid: list[list[int]]) -> str:
    return "\n".join(" ".join(map(str, row)) for row in grid)


def render(view: dict) -> str:
    text = f"Current grid (0 = empty):\n{_rows(view['grid'])}"
    if view["grid"] != view["puzzle"]:
        text = f"Puzzle (clues):\n{_rows(view['puzzle'])}\n{text}"
    return text


PROMPTS = PuzzlePrompts(
    rules=(
        "Sudoku 4x4: fill every 0 with 1-4 so that each row, each column and each 2x2 box holds 1, 2, 3, 4 "
        "exactly once. The given clues cannot change. Rows and columns are numbered 0-3."
    ),
    answer_format=(
        "End with <answer></answer> holding the full grid, one row per line (e.g. 1 2 3 4), "
        "or a list of fills [row, col, value]."
    ),
    output_format="the full grid, one row per line, e.g. 1 2 3 4",
    state_schema='{"grid": 4x4 list of ints (0 = empty), "puzzle": the 4x4 clues}',
    render=render,
)
