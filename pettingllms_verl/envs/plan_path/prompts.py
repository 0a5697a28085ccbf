"""Plan-Path prompts (replies are parsed with ``parsing.parse_moves``)."""

from __future__ import annotations

from pettingllms_verl.envs.tool_plan import PuzzlePrompts


def render(view: dict) -> str:
    rows = [list(row) for row in view["grid"]]
    (r, c), (gr, gc) = view["pos"], view["goal"]
    rows[gr][gc] = "G"
    rows[r][c] = "@"
    grid = "\n".join("".join(row) for row in rows)
    return f"Grid (# wall, . free, @ you, G goal):\n{grid}\nCurrent position: ({r}, {c}). Goal: ({gr}, {gc})."


PROMPTS = PuzzlePrompts(
    rules=(
        "Plan-Path: move from your position @ to the goal G on a grid. Positions are (row, col), "
        "row 0 at the top. Moves: U (row-1), D (row+1), L (col-1), R (col+1). A move into a wall # "
        "or off the grid is invalid and you stay. A shortest path earns a bonus."
    ),
    answer_format="End with your moves in <answer></answer>, e.g. <answer>R R D</answer>.",
    output_format="the moves on one line, e.g. R R D",
    state_schema='{"grid": [rows as strings], "pos": [row, col], "goal": [row, col]}',
    render=render,
)
