"""Sokoban prompts (replies are parsed with ``parsing.parse_moves``)."""

from __future__ import annotations

from pettingllms_verl.envs.tool_plan import PuzzlePrompts


def render(view: dict) -> str:
    room = "\n".join(view["room"])
    return (
        f"Room:\n{room}\nPlayer at {tuple(view['player'])}. Boxes at {', '.join(map(str, map(tuple, view['boxes'])))}. "
        f"Targets at {', '.join(map(str, map(tuple, view['targets'])))}. Moves left: {view['moves_left']}."
    )


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
)
