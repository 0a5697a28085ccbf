"""Tic-Tac-Toe: 3x3, players ``x`` and ``o``, and a memoised minimax for perfect opponents.

Workflows (5 turns: enough for the 9 cells):
- ``mas``: symmetric self-play. Both roles reply in turn; ``turn_order`` is ``(first, other)``
  (``("x", "o")`` unless the task says ``o`` starts). Whether the two roles share one policy is
  the agent->policy mapping's business.
- ``sa``: one agent plays ``x``; build the env with ``mode="sa"`` and every ``x`` step is answered,
  inside the same ``step``, by the task's fixed opponent (``"random"`` or ``"minimax"``, seeded). When
  the task says ``o`` starts, the opponent opens during ``reset``.

Task: ``{"seed", "first": "x"|"o", "opponent": "random"|"minimax"}`` (``opponent`` only acts in sa).
The opponent's choice is a function of (seed, board), so clones in the same position get the same
reply and no RNG state has to be copied.

A reply that names no cell 0-8 (``parse_ok=False``) or names an occupied cell leaves the board
unchanged, costs ``INVALID_PENALTY`` and forfeits the turn: the other player moves next, which keeps
the workflow's fixed alternation valid. The episode ends on a win, a full board, or when the agent
roles have used their turn budget ("unfinished": neither won nor drew; ``truncated``).

Rewards. Outcome reward of a role: win ``WIN``, draw ``DRAW``, loss ``LOSS``, unfinished 0. A step's
local reward = ``INVALID_PENALTY`` if the reply was invalid, plus the actor's outcome reward if the
game ended during the step (in sa that includes the opponent's answer, so a move that lets the
opponent win earns ``LOSS``). In mas the loser's ``LOSS`` lands on the winner's step; it is reported in
``info["final_rewards"]``, and in plain episodes (K = 1) the episode runner adds each other role's
outcome to its last reply (``episodes.core.credit_final_rewards``). In a K-branch tree each branch
that leaves the game going gets ``position_value`` added instead: the mover's outcome reward under
perfect play from there (the memoised minimax), so a move that lets the opponent win next is charged
``LOSS`` and a block that saves the game earns ``DRAW`` (or ``WIN``).
``global_reward``: sa = the agent's outcome reward; mas = mean outcome reward of both roles (0.5 for
a draw, 0 for a decisive or unfinished game: in self-play a decisive game means one side blundered).
``success`` ("draw counts as not-lost"): sa = ``x`` did not lose; mas = neither lost (a draw).
"""

from __future__ import annotations

import random
from functools import cache

from pettingllms_verl.envs.base import Env, StepResult, Workflow, ignored, workflow_for
from pettingllms_verl.envs.text import Messages
from pettingllms_verl.envs.tictactoe import prompts

EMPTY = "."
LINES = ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6))
MAX_TURNS = 5
WIN, DRAW, LOSS = 1.0, 0.5, -1.0
INVALID_PENALTY = -0.5
OPPONENTS = ("random", "minimax")


def other(player: str) -> str:
    return "o" if player == "x" else "x"


def winner(board) -> str | None:
    for a, b, c in LINES:
        if board[a] != EMPTY and board[a] == board[b] == board[c]:
            return board[a]
    return None


def free_cells(board) -> list[int]:
    return [i for i, mark in enumerate(board) if mark == EMPTY]


@cache
def _negamax(board: str, player: str) -> int:
    """Value of ``board`` for ``player`` to move: >0 win, 0 draw, <0 loss; |value| = empty cells + 1
    at the end, so sooner wins and later losses score better."""
    if winner(board):  # the previous mover completed a line
        return -(board.count(EMPTY) + 1)
    moves = free_cells(board)
    if not moves:
        return 0
    return max(-_negamax(board[:i] + player + board[i + 1 :], other(player)) for i in moves)


def minimax_moves(board, player: str) -> list[int]:
    """Every optimal cell for ``player`` (ties kept, so callers can vary perfect play)."""
    flat = "".join(board)
    scores = {i: -_negamax(flat[:i] + player + flat[i + 1 :], other(player)) for i in free_cells(flat)}
    best = max(scores.values())
    return [i for i, score in scores.items() if score == best]


def opponent_move(kind: str, board, player: str, seed: int) -> int:
    """The fixed opponent's cell: uniform over free cells (``random``) or over optimal ones (``minimax``)."""
    rng = random.Random(f"{seed}:{''.join(board)}")  # str seeds hash with sha512: stable across runs
    return rng.choice(minimax_moves(board, player) if kind == "minimax" else free_cells(board))


class TicTacToeEnv(Env):
    name = "tictactoe"
    roles = ("x", "o")

    options = {
        "mode": "mas: both players are agents | sa: one agent against a scripted opponent",
        "opponent": f"the scripted opponent of generated tasks: {', '.join(OPPONENTS)}",
        "first": "who moves first in generated tasks: x, o or random (per seed)",
    }

    def __init__(self, mode: str = "mas", opponent: str = "random", first: str = "x") -> None:
        """``opponent`` and ``first`` ("x", "o" or "random" per seed) shape tasks generated from a seed."""
        if mode not in ("mas", "sa"):
            raise ValueError(f"tictactoe mode must be 'mas' or 'sa', not {mode!r}")
        if opponent not in OPPONENTS or first not in ("x", "o", "random"):
            raise ValueError(f"tictactoe: opponent in {OPPONENTS}, first in x/o/random (got {opponent!r}, {first!r})")
        super().__init__(mode=mode, opponent=opponent, first=first)
        self.mode = mode

    def reset(self, seed: int, task: dict | None = None) -> None:
        if task is None:
            first = self.config["first"]
            if first == "random":
                first = random.Random(seed).choice(self.roles)
            task = {"seed": int(seed), "first": first, "opponent": self.config["opponent"]}
        elif task.get("first") not in self.roles or task.get("opponent") not in OPPONENTS:
            raise ValueError(f"bad tictactoe task {task!r}")
        self._task = {"seed": int(task.get("seed", seed)), "first": task["first"], "opponent": task["opponent"]}
        self.board = [EMPTY] * 9
        self.to_move = self._task["first"]
        self.steps = 0
        self.outcome: str | None = None  # "x" | "o" (the winner) | "draw" | "unfinished"
        self.done = False
        self.success = False
        if self.mode == "sa" and self.to_move == "o":
            self._opponent_plays()

    @property
    def task(self) -> dict:
        return dict(self._task)

    def workflow(self, mode: str) -> Workflow:
        return workflow_for(mode, mas=(self._task["first"], other(self._task["first"])), sa=("x",), max_turns=MAX_TURNS)

    def result(self, role: str) -> str:
        """``role``'s result: "win", "loss", "draw", "unfinished" or "ongoing"."""
        if self.outcome in (None, "draw", "unfinished"):
            return self.outcome or "ongoing"
        return "win" if self.outcome == role else "loss"

    def outcome_reward(self, role: str) -> float:
        return {"win": WIN, "draw": DRAW, "loss": LOSS}.get(self.result(role), 0.0)

    def position_value(self, role: str) -> float:
        """``role``'s outcome reward under perfect play by both sides from here: ``WIN``, ``DRAW`` or
        ``LOSS`` (``_negamax``; the turn budget is left out: legal moves fill the board within it), or
        a finished game's own. In sa the opponent is taken as perfect: the minimax one is, the random
        one is not."""
        self.check_role(role)
        if self.done:
            return self.outcome_reward(role)
        score = _negamax("".join(self.board), self.to_move)
        score = score if self.to_move == role else -score
        return WIN if score > 0 else LOSS if score < 0 else DRAW

    @property
    def truncated(self) -> bool:
        return self.outcome == "unfinished"

    @property
    def global_reward(self) -> float:
        if self.mode == "sa":
            return self.outcome_reward("x")
        return sum(self.outcome_reward(role) for role in self.roles) / 2

    def snapshot(self) -> dict:
        return {"board": list(self.board), "to_move": self.to_move, "outcome": self.outcome}

    def observation(self, role: str) -> Messages:
        self.check_role(role)
        return prompts.messages(self.board, role, None if self.done else self.to_move)

    def step(self, role: str, text: str) -> StepResult:
        self.check_role(role)
        if self.done:
            return ignored("episode is done")
        if role != self.to_move:
            return ignored(f"not {role}'s turn")
        cell = prompts.parse_cell(text)
        reward, info = 0.0, {}
        if cell is None:
            reward, info["invalid"] = INVALID_PENALTY, "no cell 0-8"
        elif self.board[cell] != EMPTY:
            reward, info["invalid"] = INVALID_PENALTY, f"cell {cell} is taken"
        else:
            self.board[cell] = role
            info["move"] = cell
        self._end_move()
        self.steps += 1
        if self.mode == "sa" and not self.done:
            info["opponent_move"] = self._opponent_plays()
        if not self.done and self.steps >= MAX_TURNS * len(self.workflow(self.mode).turn_order):
            self._finish("unfinished")
        if self.done:
            reward += self.outcome_reward(role)
            info["final_rewards"] = {r: self.outcome_reward(r) for r in self.roles}
            info["result"] = {r: self.result(r) for r in self.roles}
        return StepResult(reward, cell is not None, info)

    def clone(self) -> TicTacToeEnv:
        twin = super().clone()
        twin.board = self.board[:]  # the only mutable per-episode field
        return twin

    def _opponent_plays(self) -> int:
        cell = opponent_move(self._task["opponent"], self.board, "o", self._task["seed"])
        self.board[cell] = "o"
        self._end_move()
        return cell

    def _end_move(self) -> None:
        won = winner(self.board)
        if won or EMPTY not in self.board:
            self._finish(won or "draw")
        self.to_move = other(self.to_move)

    def _finish(self, outcome: str) -> None:
        self.outcome = outcome
        self.done = True
        self.success = self.result("x") in ("win", "draw") if self.mode == "sa" else outcome == "draw"
