"""Plan-Path prompts (replies are parsed with ``text.parse_moves``)."""

from __future__ import annotations

from pettingllms_verl.envs.images import draw_grid
from pettingllms_verl.envs.tool_plan import PuzzlePrompts

PALETTE = {"#": (40, 40, 40), ".": (255, 255, 255), "@": (30, 90, 230), "G": (30, 180, 60)}


def symbols(view: dict) -> list[str]:
    """The grid's rows with the agent (@) and the goal (G) on them."""
    rows = [list(row) for row in view["grid"]]
    (r, c), (gr, gc) = view["pos"], view["goal"]
    rows[gr][gc] = "G"
    rows[r][c] = "@"
    return ["".join(row) for row in rows]


def where(view: dict) -> str:
    (r, c), (gr, gc) = view["pos"], view["goal"]
    return f"Current position: ({r}, {c}). Goal: ({gr}, {gc})."


def render(view: dict) -> str:
    grid = "\n".join(symbols(view))
    return f"Grid (# wall, . free, @ you, G goal):\n{grid}\n{where(view)}"


def caption(view: dict) -> str:
    return f"The image is the grid, a square per cell (dark: wall, white: free, blue: you, green: goal).\n{where(view)}"


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
    draw=lambda view: draw_grid(symbols(view), PALETTE),
    caption=caption,
)
