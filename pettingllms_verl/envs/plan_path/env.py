"""Plan-Path: walk from start to goal on a grid with walls (tool + plan agents, see ../tool_plan.py).

Task: ``{"grid": ["..#.", ...], "start": [r, c], "goal": [r, c], "optimal_len": n}``; ``#`` wall,
``.`` free; ``optimal_len`` is the BFS shortest-path length from start to goal.

Per-move rewards (summed over a reply's moves; moves after reaching the goal are ignored):
- ``STEP_COST`` per valid move, ``INVALID_MOVE`` per move into a wall or off the grid (the
  position is unchanged);
- potential-based shaping ``PROGRESS_WEIGHT * (d_before - d_after) / optimal_len`` with d the BFS
  distance to the goal, so a whole shortest path earns ``PROGRESS_WEIGHT`` in total;
- ``GOAL_REWARD`` on reaching the goal, plus ``OPTIMAL_BONUS`` when the number of valid moves
  made so far equals ``optimal_len``.
Success: the goal is reached. ``global_reward``: 1 when solved, else the shaped progress
``1 - d / optimal_len`` clipped to [0, 1) (0 at the start or further away).

Config: ``size`` (10), ``wall_density`` (0.22), ``min_optimal_len`` (size // 2), ``max_optimal_len``
(no limit), ``max_turns`` (4),
``max_moves`` per reply (4 * size * size), ``tool_limits``.
"""

from __future__ import annotations

import functools
import random
from collections import deque

from pettingllms_verl.envs.plan_path.prompts import PROMPTS
from pettingllms_verl.envs.text import DIRECTION_ALIASES, parse_moves
from pettingllms_verl.envs.tool_plan import ToolPlanEnv

STEP_COST = -0.01
INVALID_MOVE = -0.1
PROGRESS_WEIGHT = 0.5
GOAL_REWARD = 1.0
OPTIMAL_BONUS = 0.5

MOVE_DELTAS = {"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1)}


def bfs_distances(grid: list[str], goal: tuple[int, int]) -> list[int]:
    """Shortest-path distance to ``goal`` of every cell, row-major; -1 for walls and unreachable cells."""
    height, width = len(grid), len(grid[0])
    dist = [-1] * (height * width)
    gr, gc = goal
    dist[gr * width + gc] = 0
    queue = deque([(gr, gc)])
    while queue:
        r, c = queue.popleft()
        here = dist[r * width + c]
        for dr, dc in MOVE_DELTAS.values():
            nr, nc = r + dr, c + dc
            if 0 <= nr < height and 0 <= nc < width and grid[nr][nc] != "#" and dist[nr * width + nc] < 0:
                dist[nr * width + nc] = here + 1
                queue.append((nr, nc))
    return dist


def generate_task(seed: int, size: int = 10, wall_density: float = 0.22, min_optimal_len: int | None = None,
                  max_optimal_len: int | None = None) -> dict:
    """A random grid with start and goal at least ``min_optimal_len`` and at most ``max_optimal_len``
    moves apart (seeded)."""
    rng = random.Random(seed)
    min_len = max(1, size // 2 if min_optimal_len is None else min_optimal_len)
    max_len = size * size if max_optimal_len is None else max_optimal_len
    if max_len < min_len:
        raise ValueError(f"plan_path: max_optimal_len {max_len} is below min_optimal_len {min_len}")
    while True:
        grid = ["".join("#" if rng.random() < wall_density else "." for _ in range(size)) for _ in range(size)]
        free = [(r, c) for r in range(size) for c in range(size) if grid[r][c] == "."]
        if len(free) < 2:
            continue
        start, goal = rng.sample(free, 2)
        optimal_len = bfs_distances(grid, goal)[start[0] * size + start[1]]
        if min_len <= optimal_len <= max_len:
            return {"grid": grid, "start": list(start), "goal": list(goal), "optimal_len": optimal_len}


@functools.lru_cache(maxsize=4096)
def _tables(grid: tuple[str, ...], goal: tuple[int, int]) -> tuple[tuple[int, ...], dict[str, tuple[int, ...]]]:
    """A task's read-only tables (distances to the goal, moves), built once per task and process:
    the K episodes of a problem, its tree's clones and later epochs reset from the same task."""
    return tuple(bfs_distances(list(grid), goal)), _neighbour_table(list(grid))


def _neighbour_table(grid: list[str]) -> dict[str, tuple[int, ...]]:
    """move -> (cell index -> index after the move, or -1 when the move is invalid)."""
    height, width = len(grid), len(grid[0])
    table = {}
    for move, (dr, dc) in MOVE_DELTAS.items():
        targets = []
        for r in range(height):
            for c in range(width):
                nr, nc = r + dr, c + dc
                ok = 0 <= nr < height and 0 <= nc < width and grid[nr][nc] != "#"
                targets.append(nr * width + nc if ok else -1)
        table[move] = tuple(targets)
    return table


class PlanPathEnv(ToolPlanEnv):
    name = "plan_path"
    prompts = PROMPTS
    default_max_turns = 4
    options = {
        **ToolPlanEnv.options,
        **ToolPlanEnv.IMAGE_ROLES,
        "size": "grid side of generated tasks (default 10)",
        "wall_density": "fraction of wall cells of generated tasks (default 0.22)",
        "min_optimal_len": "shortest path length a generated task must have at least",
        "max_optimal_len": "shortest path length a generated task may have at most",
        "max_moves": "moves read from one reply, the rest ignored (default 4 x cells)",
    }

    def reset(self, seed: int, task: dict | None = None) -> None:
        cfg = self.config
        size = int(cfg.get("size", 10))
        if task is None:
            task = generate_task(seed, size, float(cfg.get("wall_density", 0.22)), cfg.get("min_optimal_len"), cfg.get("max_optimal_len"))
        grid = list(task["grid"])
        width = len(grid[0])
        # per-task tables: shared with clones, never mutated
        self._task = task
        self._width = width
        self._goal = task["goal"][0] * width + task["goal"][1]
        self._dist, self._next = _tables(tuple(grid), tuple(task["goal"]))
        self._optimal_len = self._dist[task["start"][0] * width + task["start"][1]]
        if self._optimal_len < 1:
            raise ValueError("plan_path task: goal unreachable from start (or equal to it)")
        self._max_moves = int(cfg.get("max_moves", 4 * len(grid) * width))
        # per-episode state: immutable values only (see ToolPlanEnv.clone)
        self.pos = task["start"][0] * width + task["start"][1]
        self.path_len = 0
        self._begin_episode()

    @property
    def task(self) -> dict:
        return self._task

    @property
    def position(self) -> tuple[int, int]:
        return divmod(self.pos, self._width)

    @property
    def global_reward(self) -> float:
        if self.success:
            return 1.0
        return max(0.0, 1.0 - self._dist[self.pos] / self._optimal_len)

    def view(self) -> dict:
        return {"grid": self._task["grid"], "pos": list(self.position), "goal": self._task["goal"]}

    def parse_actions(self, text: str) -> list[str] | None:
        return parse_moves(text, DIRECTION_ALIASES, self._max_moves)

    def apply(self, actions: list[str]) -> tuple[float, dict]:
        dist, table, pos = self._dist, self._next, self.pos
        reward, invalid, applied = 0.0, 0, 0
        for move in actions:
            applied += 1
            new = table[move][pos]
            if new < 0:
                reward += INVALID_MOVE
                invalid += 1
                continue
            reward += STEP_COST + PROGRESS_WEIGHT * (dist[pos] - dist[new]) / self._optimal_len
            pos = new
            self.path_len += 1
            if pos == self._goal:
                self.success = True
                reward += GOAL_REWARD + (OPTIMAL_BONUS if self.path_len == self._optimal_len else 0.0)
                break
        self.pos = pos
        return reward, {"moves": applied, "invalid": invalid}
