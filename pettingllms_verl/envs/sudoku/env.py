"""Sudoku 4x4 with 2x2 boxes (tool + plan agents, see ../tool_plan.py).

Task: ``{"puzzle": [[...]], "solution": [[...]]}``, 4x4 ints, 0 = empty. Every generated puzzle
has exactly one solution. The solver is exhaustive: there are only 288 valid 4x4 grids, each
(cell, value) keeps a bit mask of the grids that agree with it, and the solutions of a puzzle are
the AND of its clues' masks.

A reply is a full grid or a list of ``[row, col, value]`` fills (0-based). A fill equal to a clue
is a no-op; a fill that changes a clue, lies off the grid or has a value outside 1-4 is invalid
and skipped. Rewards of a reply: ``INVALID_FILL`` per invalid fill, plus ``PROGRESS_WEIGHT`` times
the change in the share of empty cells holding their solution value, plus ``SOLVED_REWARD`` when
the grid becomes solved. Solved (``is_solved``): complete, every row/column/box valid AND every
clue kept. ``global_reward``: 1 when solved, else the share of empty cells filled correctly.

Config: ``num_clues`` (6: clues are removed while the solution stays unique, down to this count),
``max_turns`` (4), ``tool_limits``.
"""

from __future__ import annotations

import functools
import random

from pettingllms_verl.envs.sudoku.prompts import PROMPTS, parse_fills
from pettingllms_verl.envs.tool_plan import ToolPlanEnv

INVALID_FILL = -0.1
PROGRESS_WEIGHT = 0.5
SOLVED_REWARD = 1.0

SIZE, BOX = 4, 2
CELLS = SIZE * SIZE
# the cells of every row, column and box, as flat indices
UNITS = (
    [[r * SIZE + c for c in range(SIZE)] for r in range(SIZE)]
    + [[r * SIZE + c for r in range(SIZE)] for c in range(SIZE)]
    + [[(br + r) * SIZE + bc + c for r in range(BOX) for c in range(BOX)] for br in range(0, SIZE, BOX) for bc in range(0, SIZE, BOX)]
)


@functools.lru_cache(maxsize=1)
def all_grids() -> tuple[tuple[int, ...], ...]:
    """Every valid 4x4 sudoku grid (288), flat, by backtracking."""
    peers = [{p for unit in UNITS if cell in unit for p in unit} - {cell} for cell in range(CELLS)]
    grids, grid = [], [0] * CELLS

    def fill(cell: int) -> None:
        if cell == CELLS:
            grids.append(tuple(grid))
            return
        for value in range(1, SIZE + 1):
            if all(grid[p] != value for p in peers[cell]):
                grid[cell] = value
                fill(cell + 1)
        grid[cell] = 0

    fill(0)
    return tuple(grids)


@functools.lru_cache(maxsize=1)
def _agreeing_masks() -> tuple[tuple[int, ...], ...]:
    """[cell][value] -> bit mask of the grids in ``all_grids()`` with ``value`` at ``cell``."""
    masks = [[0] * (SIZE + 1) for _ in range(CELLS)]
    for index, grid in enumerate(all_grids()):
        for cell, value in enumerate(grid):
            masks[cell][value] |= 1 << index
    return tuple(tuple(row) for row in masks)


def _solution_mask(flat_puzzle: list[int] | tuple[int, ...]) -> int:
    masks = _agreeing_masks()
    mask = (1 << len(all_grids())) - 1
    for cell, value in enumerate(flat_puzzle):
        if value:
            mask &= masks[cell][value]
    return mask


def solutions(puzzle: list[list[int]]) -> list[list[list[int]]]:
    """Every solution of ``puzzle`` (4x4, 0 = empty)."""
    mask = _solution_mask([value for row in puzzle for value in row])
    return [_rows(grid) for index, grid in enumerate(all_grids()) if mask >> index & 1]


def is_solved(grid: list[list[int]], puzzle: list[list[int]]) -> bool:
    """Complete, every row, column and box holds 1-4 once, and every clue of ``puzzle`` is kept."""
    flat = [value for row in grid for value in row]
    clues = [value for row in puzzle for value in row]
    if len(flat) != CELLS or any(clue and clue != value for clue, value in zip(clues, flat)):
        return False
    return all(sorted(flat[cell] for cell in unit) == [1, 2, 3, 4] for unit in UNITS)


def generate_task(seed: int, num_clues: int = 6) -> dict:
    """A random solution, then clues removed in random order while the solution stays unique."""
    rng = random.Random(seed)
    solution = rng.choice(all_grids())
    order = list(range(CELLS))
    rng.shuffle(order)
    masks = _agreeing_masks()
    agree = [masks[cell][solution[cell]] for cell in order]
    # later[k]: grids agreeing with the clues order[k:], all still present when order[k] is tried
    later = [-1] * (CELLS + 1)
    for k in range(CELLS - 1, -1, -1):
        later[k] = later[k + 1] & agree[k]
    kept, clue_count, puzzle = -1, CELLS, list(solution)
    for k, cell in enumerate(order):
        without = kept & later[k + 1]
        if clue_count > num_clues and without & (without - 1) == 0:  # one grid left: still unique
            puzzle[cell] = 0
            clue_count -= 1
        else:
            kept &= agree[k]
    return {"puzzle": _rows(puzzle), "solution": _rows(solution)}


def _rows(flat) -> list[list[int]]:
    return [list(flat[r * SIZE : (r + 1) * SIZE]) for r in range(SIZE)]


class SudokuEnv(ToolPlanEnv):
    name = "sudoku"
    prompts = PROMPTS
    default_max_turns = 4
    options = {**ToolPlanEnv.options, "num_clues": "given cells of generated 4x4 puzzles (default 6)"}

    def reset(self, seed: int, task: dict | None = None) -> None:
        if task is None:
            task = generate_task(seed, int(self.config.get("num_clues", 6)))
        # per-task tables: shared with clones, never mutated
        self._task = task
        self._puzzle = tuple(value for row in task["puzzle"] for value in row)
        self._solution = tuple(value for row in task["solution"] for value in row)
        self._empty = tuple(cell for cell in range(CELLS) if not self._puzzle[cell])
        # per-episode state: immutable values only (see ToolPlanEnv.clone)
        self.grid = self._puzzle
        self._begin_episode()

    @property
    def task(self) -> dict:
        return self._task

    def _correct_share(self) -> float:
        if not self._empty:
            return 1.0
        return sum(self.grid[cell] == self._solution[cell] for cell in self._empty) / len(self._empty)

    @property
    def global_reward(self) -> float:
        return 1.0 if self.success else self._correct_share()

    def view(self) -> dict:
        return {"grid": _rows(self.grid), "puzzle": self._task["puzzle"]}

    def parse_actions(self, text: str) -> list[tuple[int, int, int]] | None:
        return parse_fills(text)

    def apply(self, fills: list[tuple[int, int, int]]) -> tuple[float, dict]:
        grid, invalid = list(self.grid), 0
        for r, c, value in fills:
            cell = r * SIZE + c
            if not (0 <= r < SIZE and 0 <= c < SIZE and 1 <= value <= SIZE) or self._puzzle[cell] not in (0, value):
                invalid += 1
                continue
            grid[cell] = value
        before = self._correct_share()
        self.grid = tuple(grid)
        reward = INVALID_FILL * invalid + PROGRESS_WEIGHT * (self._correct_share() - before)
        if 0 not in self.grid and is_solved(_rows(self.grid), self._task["puzzle"]):
            self.success = True
            reward += SOLVED_REWARD
        return reward, {"fills": len(fills), "invalid": invalid}
