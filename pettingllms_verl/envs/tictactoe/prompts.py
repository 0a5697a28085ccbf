"""Tic-Tac-Toe prompts and reply parser (a cell number 0-8)."""

from __future__ import annotations

from pettingllms_verl.envs.text import Messages, last_int

SYSTEM = (
    "You play Tic-Tac-Toe on a 3x3 board as {mark}. Cells are numbered 0-8 row by row; an empty "
    "cell shows its number. Three of your marks in a row, column or diagonal win. Taking an occupied "
    "cell, or giving no cell, loses your turn. Think briefly, then end with the cell you take, "
    "e.g. <answer>4</answer>."
)


def render_board(board: list[str]) -> str:
    cells = [str(i) if mark == "." else mark.upper() for i, mark in enumerate(board)]
    return "\n---+---+---\n".join(" " + " | ".join(cells[r : r + 3]) for r in (0, 3, 6))


def messages(board: list[str], role: str, to_move: str | None) -> Messages:
    """``to_move`` is None once the game is over."""
    if to_move is None:
        turn = "The game is over."
    elif to_move == role:
        turn = f"It is your turn ({role.upper()}). Free cells: {', '.join(str(i) for i, m in enumerate(board) if m == '.')}."
    else:
        turn = f"It is {to_move.upper()}'s turn."
    return [
        {"role": "system", "content": SYSTEM.format(mark=role.upper())},
        {"role": "user", "content": f"Board:\n{render_board(board)}\n\n{turn}"},
    ]


def parse_cell(text: str) -> int | None:
    """The last number of the answer when it is a cell (0-8), else None."""
    return last_int(text, 0, 8)
