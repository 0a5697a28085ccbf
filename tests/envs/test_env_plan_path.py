"""Plan-Path: BFS, rewards, prompts, clones, the tool agent, fuzzed replies, data prep."""

import dataclasses
import importlib.util
import json

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pettingllms_verl.envs import make
from pettingllms_verl.envs.plan_path import env as pp
from pettingllms_verl.envs.base import PARSE_PENALTY, TOOL_FAILURE_PENALTY

from support import REPO

ROOT = REPO

# From (0, 0) to (2, 0) the wall row forces the detour R R R D D L L L (8 moves).
DETOUR = {"grid": ["....", "###.", "...."], "start": [0, 0], "goal": [2, 0], "optimal_len": 8}
SHORTEST = "<answer>R R R D D L L L</answer>"

# The tool's program: BFS over the JSON state on stdin, prints a shortest path.
BFS_PROGRAM = """```python
import json, sys
from collections import deque
s = json.load(sys.stdin)
g, start, goal = s["grid"], tuple(s["pos"]), tuple(s["goal"])
prev, queue = {start: None}, deque([start])
while queue:
    p = queue.popleft()
    for m, (dr, dc) in {"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1)}.items():
        n = (p[0] + dr, p[1] + dc)
        if 0 <= n[0] < len(g) and 0 <= n[1] < len(g[0]) and g[n[0]][n[1]] != "#" and n not in prev:
            prev[n] = (p, m)
            queue.append(n)
moves, p = [], goal
while prev[p]:
    p, m = prev[p]
    moves.append(m)
print(" ".join(reversed(moves)))
```"""


def env_at(task=DETOUR, **config):
    env = make("plan_path", **config)
    env.reset(0, task)
    return env


def test_bfs_distances_on_hand_built_grids():
    dist = pp.bfs_distances(DETOUR["grid"], (2, 0))
    assert dist[0] == 8  # (0, 0)
    assert dist[4] == -1  # wall (1, 0)
    assert dist[7] == 4  # (1, 3): D L L L
    ring = pp.bfs_distances(["...", ".#.", "..."], (0, 0))
    assert ring == [0, 1, 2, 1, -1, 3, 2, 3, 4]
    assert pp.bfs_distances([".#."], (0, 0)) == [0, -1, -1]  # walled off


def test_generated_tasks_are_seeded_reachable_and_optimal():
    for seed in range(30):
        task = pp.generate_task(seed, size=10)
        assert task == pp.generate_task(seed, size=10)
        assert len(task["grid"]) == 10 and all(len(row) == 10 for row in task["grid"])
        (sr, sc), (gr, gc) = task["start"], task["goal"]
        assert task["grid"][sr][sc] == "." and task["grid"][gr][gc] == "."
        assert task["optimal_len"] == pp.bfs_distances(task["grid"], (gr, gc))[sr * 10 + sc] >= 5
    density = sum(row.count("#") for s in range(200) for row in pp.generate_task(s)["grid"]) / 20000
    assert 0.17 < density < 0.27
    assert len(pp.generate_task(1, size=6)["grid"]) == 6


def test_max_optimal_len_bounds_the_routes_of_generated_tasks_and_the_env_passes_it():
    lengths = {pp.generate_task(seed, size=4, wall_density=0.3, max_optimal_len=3)["optimal_len"] for seed in range(60)}
    assert lengths == {2, 3}  # min 4 // 2; unbounded, 4x4 grids reach 4 and more moves
    assert max(pp.generate_task(seed, size=4, wall_density=0.3)["optimal_len"] for seed in range(60)) > 3
    env = pp.PlanPathEnv(size=4, wall_density=0.3, max_optimal_len=2)
    for seed in range(10):
        env.reset(seed)
        assert env.task["optimal_len"] == 2
    with pytest.raises(ValueError, match="max_optimal_len 1 is below min_optimal_len 2"):
        pp.generate_task(0, size=4, max_optimal_len=1)


def test_shortest_path_solves_with_goal_reward_and_bonus():
    env = env_at()
    result = env.step("plan", SHORTEST)
    assert env.success and env.done and env.global_reward == 1.0
    expected = 8 * pp.STEP_COST + pp.PROGRESS_WEIGHT + pp.GOAL_REWARD + pp.OPTIMAL_BONUS
    assert result.local_reward == pytest.approx(expected)


def test_detour_reaches_goal_without_optimality_bonus():
    env = env_at()
    result = env.step("plan", "<answer>R L R R R D D L L L</answer>")
    assert env.success
    assert result.local_reward == pytest.approx(10 * pp.STEP_COST + pp.PROGRESS_WEIGHT + pp.GOAL_REWARD)


def test_invalid_moves_are_penalised_and_do_not_move():
    env = env_at()
    result = env.step("plan", "<answer>U D L</answer>")  # off the grid, into a wall, off the grid
    assert env.position == (0, 0)
    assert result.local_reward == pytest.approx(3 * pp.INVALID_MOVE)
    assert result.info == {"moves": 3, "invalid": 3}
    assert not env.success and not env.done


def test_progress_shaping_and_global_reward():
    env = env_at()
    assert env.global_reward == 0.0
    result = env.step("plan", "<answer>R R R D</answer>")  # distance 8 -> 4
    assert result.local_reward == pytest.approx(4 * pp.STEP_COST + pp.PROGRESS_WEIGHT * 4 / 8)
    assert env.global_reward == pytest.approx(0.5)
    env.step("plan", "<answer>U L L L</answer>")  # back to the start: shaping refunds the progress
    assert env.global_reward == 0.0


def test_prompt_shows_current_position():
    env = env_at()
    env.step("plan", "<answer>R R</answer>")
    user = env.observation("plan")[1]["content"]
    assert "Current position: (0, 2)" in user and "Goal: (2, 0)" in user
    assert "..@." in user.splitlines()[1]  # "@" drawn where the agent is now
    assert "G" in user.splitlines()[3]


def test_unparseable_reply_penalised_state_unchanged_turn_used():
    env = env_at(max_turns=2)
    result = env.step("plan", "I am not sure where to go.")
    assert result.local_reward == PARSE_PENALTY and not result.parse_ok
    assert env.position == (0, 0) and env.turn == 1 and not env.done
    env.step("plan", "???")
    assert env.done and not env.success and env.truncated
    assert env.step("plan", SHORTEST).info == {"ignored": "episode is done"} and not env.success


def test_workflows_share_the_turn_budget():
    env = env_at(max_turns=3)
    assert env.workflow("mas").turn_order == ("tool", "plan")
    assert env.workflow("sa").turn_order == ("plan",)
    assert env.workflow("mas").max_turns == env.workflow("sa").max_turns == 3
    with pytest.raises(ValueError):
        env.workflow("solo")


def test_clones_are_independent():
    parent = env_at()
    first, second = parent.clone(), parent.clone()
    first.step("plan", SHORTEST)
    assert first.success and first.position == (2, 0)
    assert parent.position == second.position == (0, 0)
    assert not parent.done and not second.success and parent.turn == second.turn == 0
    second.step("plan", "<answer>R</answer>")
    assert second.position == (0, 1) and first.position == (2, 0) and parent.position == (0, 0)
    grandchild = second.clone()
    grandchild.step("plan", "<answer>R</answer>")
    assert second.position == (0, 1) and grandchild.position == (0, 2)


def test_tool_actions_scored_on_clone_not_applied():
    env = env_at()
    before = env.view()
    result = env.step("tool", BFS_PROGRAM)
    assert env.view() == before and not env.success and env.turn == 0
    reference = env_at()
    assert result.local_reward == pytest.approx(reference.step("plan", SHORTEST).local_reward)
    assert result.info["tool_status"] == "ok" and result.info["would_solve"]
    plan_prompt = env.observation("plan")[1]["content"]
    assert "queue.popleft()" in plan_prompt and "R R R D D L L L" in plan_prompt


def test_tool_failures_are_penalised():
    env = env_at(tool_limits={"wall_s": 0.5})
    stuck = env.step("tool", "```python\nwhile True:\n    pass\n```")
    assert stuck.local_reward == TOOL_FAILURE_PENALTY and stuck.info["tool_status"] == "timeout"
    assert stuck.info["sandbox_runs"] == {"timeout": 1}  # reaches the metrics (mas/tool/sandbox/timeout)
    assert env.observation("plan")[1]["content"].endswith("[timeout]")
    env.tool_limits = dataclasses.replace(env.tool_limits, wall_s=60.0)  # the programs below end by themselves, however slowly
    crashed = env.step("tool", "```python\nraise SystemExit(3)\n```")
    assert crashed.local_reward == TOOL_FAILURE_PENALTY and crashed.info["tool_status"] == "error"
    assert crashed.info["sandbox_runs"] == {"error": 1}
    garbage = env.step("tool", "```python\nprint('no idea')\n```")
    assert garbage.local_reward == TOOL_FAILURE_PENALTY and garbage.info["tool_status"] == "no_actions"
    no_code = env.step("tool", "go right")
    assert no_code.local_reward == PARSE_PENALTY and not no_code.parse_ok
    assert env.view()["pos"] == [0, 0]


def test_single_agent_prompt_has_no_tool_section():
    env = env_at()
    assert "tool agent" not in env.observation("plan")[1]["content"]


replies = st.one_of(
    st.text(max_size=200),
    st.lists(st.sampled_from(["<answer>", "</answer>", "U", "down", "R", "```", "9" * 5000, "😀", "\n", " "]), max_size=30).map("".join),
)


@settings(max_examples=200, deadline=None)
@given(replies)
def test_fuzzed_replies_never_raise(text):
    env = env_at()
    moves = env.parse_actions(text)
    result = env.step("plan", text)
    if moves is None:
        assert result.local_reward == PARSE_PENALTY and env.position == (0, 0)
    else:
        assert set(moves) <= set("UDLR") and result.parse_ok
    assert 0.0 <= env.global_reward <= 1.0


def load_script(name):
    spec = importlib.util.spec_from_file_location(f"data_prep_{name}", ROOT / "data_prep" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_data_prep_writes_disjoint_splits(tmp_path):
    load_script("plan_path").main(["--out-dir", str(tmp_path), "--train", "60", "--val", "10", "--test", "20", "--size", "8"])
    train, val, test = (pd.read_parquet(tmp_path / f"{split}.parquet") for split in ("train", "val", "test"))
    assert (len(train), len(val), len(test)) == (60, 10, 20)
    frames = {"train": train, "val": val, "test": test}
    tasks = {split: {row["task_json"] for row in frame["extra_info"]} for split, frame in frames.items()}
    seeds = {split: {row["seed"] for row in frame["extra_info"]} for split, frame in frames.items()}
    assert len(tasks["train"]) == 60
    for a, b in (("train", "val"), ("train", "test"), ("val", "test")):
        assert not tasks[a] & tasks[b] and not seeds[a] & seeds[b]
    task = json.loads(test["extra_info"][0]["task_json"])
    assert len(task["grid"]) == 8
    env = env_at(task)
    assert env.task == task
