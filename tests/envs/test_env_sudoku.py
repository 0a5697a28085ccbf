"""Sudoku 4x4: unique puzzles, the clue-keeping solved check, fills, clones, the tool agent, fuzz, data prep."""

import importlib.util
import json

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pettingllms_verl.envs import make
from pettingllms_verl.envs.sudoku import env as sd
from pettingllms_verl.envs.base import PARSE_PENALTY

from support import REPO

ROOT = REPO

SOLUTION = [[1, 2, 3, 4], [3, 4, 1, 2], [2, 1, 4, 3], [4, 3, 2, 1]]
PUZZLE = [[1, 0, 0, 0], [3, 0, 1, 2], [2, 0, 0, 3], [0, 0, 0, 0]]  # 6 clues, 10 empty cells
CLUES = {(r, c): v for r, row in enumerate(PUZZLE) for c, v in enumerate(row) if v}
TASK = {"puzzle": PUZZLE, "solution": SOLUTION}


def env_at(task=TASK, **config):
    env = make("sudoku", **config)
    env.reset(0, task)
    return env


def grid_text(grid):
    return "<answer>\n" + "\n".join(" ".join(map(str, row)) for row in grid) + "\n</answer>"


def count_solutions(puzzle):
    """Independent backtracking counter (no shared code with the packaged solver)."""
    grid = [row[:] for row in puzzle]

    def ok(r, c, v):
        box = [grid[br][bc] for br in range(r // 2 * 2, r // 2 * 2 + 2) for bc in range(c // 2 * 2, c // 2 * 2 + 2)]
        return v not in grid[r] and v not in [grid[i][c] for i in range(4)] and v not in box

    def count(cell):
        if cell == 16:
            return 1
        r, c = divmod(cell, 4)
        if grid[r][c]:
            return count(cell + 1)
        total = 0
        for v in range(1, 5):
            if ok(r, c, v):
                grid[r][c] = v
                total += count(cell + 1)
                grid[r][c] = 0
        return total

    return count(0)


def test_puzzle_fixture_is_unique():
    assert count_solutions(PUZZLE) == 1 and sd.solutions(PUZZLE) == [SOLUTION]


def test_solver_matches_backtracking():
    assert len(sd.all_grids()) == 288 == count_solutions([[0] * 4 for _ in range(4)])
    assert len(sd.solutions([[1, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]])) == 72
    assert sd.solutions([[1, 1, 0, 0]] + [[0] * 4] * 3) == []


def test_generated_puzzles_have_exactly_one_solution():
    for seed in range(150):
        task = sd.generate_task(seed)
        assert count_solutions(task["puzzle"]) == 1
        assert sd.solutions(task["puzzle"]) == [task["solution"]]
        assert sum(v > 0 for row in task["puzzle"] for v in row) == 6
        assert all(p in (0, s) for prow, srow in zip(task["puzzle"], task["solution"]) for p, s in zip(prow, srow))
    assert sd.generate_task(4) == sd.generate_task(4) != sd.generate_task(5)


def test_is_solved_requires_every_clue():
    assert sd.is_solved(SOLUTION, PUZZLE)
    # a valid sudoku grid (hence a Latin square) that changes the clue at (0, 0)
    other = next(g for g in sd.all_grids() if g[0] != 1)
    other_rows = [list(other[r * 4 : r * 4 + 4]) for r in range(4)]
    assert sd.is_solved(other_rows, [[0] * 4 for _ in range(4)])
    assert not sd.is_solved(other_rows, PUZZLE)
    latin_not_sudoku = [[1, 2, 3, 4], [2, 3, 4, 1], [3, 4, 1, 2], [4, 1, 2, 3]]  # boxes repeat
    assert not sd.is_solved(latin_not_sudoku, [[0] * 4 for _ in range(4)])
    assert not sd.is_solved([row[:3] + [0] for row in SOLUTION], PUZZLE)


def test_full_grid_answer_solves():
    env = env_at()
    result = env.step("plan", grid_text(SOLUTION))
    assert env.success and env.done and env.global_reward == 1.0
    assert result.local_reward == pytest.approx(sd.PROGRESS_WEIGHT + sd.SOLVED_REWARD)


def test_grid_changing_a_clue_is_not_solved():
    other = next(g for g in sd.all_grids() if g[0] != 1)
    env = env_at()
    result = env.step("plan", grid_text([list(other[r * 4 : r * 4 + 4]) for r in range(4)]))
    assert not env.success and env.view()["grid"][0][0] == 1  # the clue stays
    assert result.info["invalid"] >= 1


def test_fills_rewards_and_invalid_fills():
    env = env_at()
    result = env.step("plan", "<answer>[0, 1, 2], [0, 2, 4], [0, 0, 3], [9, 0, 1], [1, 1, 7]</answer>")
    # (0,1)=2 correct, (0,2)=4 wrong, (0,0) is a clue, (9,0) off grid, value 7 out of range
    assert result.info == {"fills": 5, "invalid": 3}
    assert result.local_reward == pytest.approx(3 * sd.INVALID_FILL + sd.PROGRESS_WEIGHT / 10)
    assert env.view()["grid"][0] == [1, 2, 4, 0]
    assert env.global_reward == pytest.approx(1 / 10)
    fix = env.step("plan", "<answer>[0, 2, 3]</answer>")
    assert fix.local_reward == pytest.approx(sd.PROGRESS_WEIGHT / 10)
    assert env.step("plan", "<answer>[0, 0, 1]</answer>").info["invalid"] == 0  # restating a clue


def test_prompt_shows_current_grid_and_clues():
    env = env_at()
    env.step("plan", "<answer>[0, 1, 2]</answer>")
    user = env.observation("plan")[1]["content"]
    assert "Current grid (0 = empty):\n1 2 0 0\n3 0 1 2" in user and "Puzzle (clues):\n1 0 0 0\n3 0 1 2" in user


def test_unparseable_reply_keeps_state():
    env = env_at()
    result = env.step("plan", "no idea")
    assert result.local_reward == PARSE_PENALTY and not result.parse_ok
    assert env.view()["grid"] == PUZZLE and env.turn == 1


def test_clones_are_independent():
    parent = env_at()
    first, second = parent.clone(), parent.clone()
    first.step("plan", grid_text(SOLUTION))
    assert first.success
    assert parent.view()["grid"] == second.view()["grid"] == PUZZLE and not parent.done and not second.success
    second.step("plan", "<answer>[3, 0, 4]</answer>")  # (3, 0) is empty in PUZZLE
    assert second.view()["grid"][3][0] == 4 and parent.view()["grid"][3][0] == 0 and first.view()["grid"] == SOLUTION


def test_tool_actions_scored_on_clone_not_applied():
    env = env_at()
    solver = (
        "```python\nimport json, sys, itertools\ng = json.load(sys.stdin)['grid']\n"
        "def ok(s):\n    return all(sorted(u) == [1, 2, 3, 4] for u in s + [list(c) for c in zip(*s)] + "
        "[[s[r][c] for r in (br, br + 1) for c in (bc, bc + 1)] for br in (0, 2) for bc in (0, 2)])\n"
        "rows = [[p for p in itertools.permutations(range(1, 5)) if all(v == 0 or v == p[i] for i, v in enumerate(row))] for row in g]\n"
        "sol = next(list(map(list, s)) for s in itertools.product(*rows) if ok(list(map(list, s))))\n"
        "print('\\n'.join(' '.join(map(str, r)) for r in sol))\n```"
    )
    result = env.step("tool", solver)
    assert result.info["tool_status"] == "ok" and result.info["would_solve"]
    assert env.view()["grid"] == PUZZLE and not env.success
    assert result.local_reward == pytest.approx(env_at().step("plan", grid_text(SOLUTION)).local_reward)
    assert "3 4 1 2" in env.observation("plan")[1]["content"]


replies = st.one_of(
    st.text(max_size=200),
    st.lists(st.sampled_from(["<answer>", "</answer>", "[", "]", ",", "1", "4", "0", "-3", "9" * 5000, "٣", "\n", " "]), max_size=40).map("".join),
)


@settings(max_examples=200, deadline=None)
@given(replies)
def test_fuzzed_replies_never_raise(text):
    env = env_at()
    fills = env.parse_actions(text)
    result = env.step("plan", text)
    if fills is None:
        assert result.local_reward == PARSE_PENALTY and env.view()["grid"] == PUZZLE
    grid = env.view()["grid"]
    assert all(0 <= v <= 4 for row in grid for v in row) and all(grid[r][c] == v for (r, c), v in CLUES.items())
    assert 0.0 <= env.global_reward <= 1.0


def test_data_prep_disjoint_by_puzzle(tmp_path):
    spec = importlib.util.spec_from_file_location("data_prep_sudoku", ROOT / "data_prep" / "sudoku.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    script.main(["--out-dir", str(tmp_path), "--train", "300", "--val", "30", "--test", "50"])
    train, val, test = (pd.read_parquet(tmp_path / f"{split}.parquet") for split in ("train", "val", "test"))
    assert (len(train), len(val), len(test)) == (300, 30, 50)
    puzzles = {
        name: [json.dumps(json.loads(row["task_json"])["puzzle"]) for row in frame["extra_info"]]
        for name, frame in (("train", train), ("val", val), ("test", test))
    }
    assert len(set(puzzles["train"])) == 300 and len(set(puzzles["val"])) == 30 and len(set(puzzles["test"])) == 50
    assert not set(puzzles["train"]) & set(puzzles["test"])
    assert not set(puzzles["val"]) & (set(puzzles["train"]) | set(puzzles["test"]))
    task = json.loads(test["extra_info"][0]["task_json"])
    assert count_solutions(task["puzzle"]) == 1 and env_at(task).task == task
