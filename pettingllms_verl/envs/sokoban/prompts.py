"""Sokoban prompts (replies are parsed with ``text.parse_moves``)."""

from __future__ import annotations

from pettingllms_verl.envs.images import draw_grid
from pettingllms_verl.envs.tool_plan import PuzzlePrompts

# XSB symbols: wall, floor, target, box, box on target, player, player on target
PALETTE = {"#": (40, 40, 40), " ": (255, 255, 255), ".": (250, 210, 60), "$": (150, 90, 40), "*": (90, 160, 40),
           "@": (30, 90, 230), "+": (120, 60, 200)}


def where(view: dict) -> str:
    return (f"Player at {tuple(view['player'])}. Boxes at {', '.join(map(str, map(tuple, view['boxes'])))}. "
            f"Targets at {', '.join(map(str, map(tuple, view['targets'])))}. Moves left: {view['moves_left']}.")


def render(view: dict) -> str:
    room = "\n".join(view["room"])
    return f"Room:\n{room}\n{where(view)}"


def caption(view: dict) -> str:
    return ("The image is the room, a square per cell (dark: wall, white: floor, yellow: target, brown: box, "
            f"green: box on target, blue: you, purple: you on target).\n{where(view)}")


PROMPTS = PuzzlePrompts(
    rules=(
        "Sokoban: push every box onto a target. Room symbols: # wall, space floor, . target, $ box, "
        "* box on target, @ you, + you on target. Positions are (row, col), row 0 at the top. Moves: "
        "U (row-1), D (row+1), L (col-1), R (col+1). Walking into a box pushes it one cell if the cell "
        "behind it is free; you cannot pull boxes. A box pushed into a corner is stuck."
    ),
    answer_format="End with your moves in <answer></answer>, e.g. <answer>R R D</answer>.",
    output_format="the moves on one line, e.g. R R D",
    state_schema=(
        '{"room": [rows as strings], "player": [row, col], "boxes": [[row, col], ...], '
        '"targets": [[row, col], ...], "moves_left": n}'
    ),
    render=render,
    draw=lambda view: draw_grid(view["room"], PALETTE),
    caption=caption,
)
