"""Sokoban: generator + solver, push rules and rewards, clones, the tool agent, fuzzed replies, data prep."""

import importlib.util
import json

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pettingllms_verl.envs import make
from pettingllms_verl.envs.sokoban import env as sk
from pettingllms_verl.envs.base import PARSE_PENALTY

from support import REPO

ROOT = REPO

# Push the box right twice onto the target: R R.
CORRIDOR = {"room": ["######", "#@$ .#", "#    #", "######"], "max_steps": 6}


def env_at(task=CORRIDOR, **config):
    env = make("sokoban", **config)
    env.reset(0, task)
    return env


def test_solver_on_hand_built_rooms():
    room, player, boxes = sk.parse_xsb(CORRIDOR["room"])
    assert sk.shortest_solution(room, player, boxes, 20) == 2
    assert sk.shortest_solution(room, player, boxes, 1) is None  # over the limit
    cornered = sk.parse_xsb(["#####", "#$ .#", "# @ #", "#####"])
    assert sk.shortest_solution(*cornered, 50) is None
    adjacent = sk.parse_xsb(["######", "#.$@ #", "#    #", "######"])
    assert sk.shortest_solution(*adjacent, 20) == 1  # L
    around = sk.parse_xsb(["######", "#.@$ #", "#    #", "######"])
    assert sk.shortest_solution(*around, 20) == 6  # D R R U walks behind the box, L L pushes it home
    assert sk.shortest_solution(*sk.parse_xsb(["####", "#@*#", "####"]), 5) == 0
    with pytest.raises(ValueError):
        sk.parse_xsb(["#####", "#@$ #", "#####"])  # a box without a target


def naive_solution_length(rows, limit):
    """Plain BFS on (player, boxes) with coordinates, no pruning: the reference for the packaged solver."""
    walls = {(r, c) for r, row in enumerate(rows) for c, ch in enumerate(row) if ch == "#"}
    targets = {(r, c) for r, row in enumerate(rows) for c, ch in enumerate(row) if ch in ".*+"}
    boxes = frozenset((r, c) for r, row in enumerate(rows) for c, ch in enumerate(row) if ch in "$*")
    player = next((r, c) for r, row in enumerate(rows) for c, ch in enumerate(row) if ch in "@+")
    frontier, seen = [(player, boxes)], {(player, boxes)}
    for depth in range(limit + 1):
        if any(b <= targets for _, b in frontier):
            return depth
        nxt = []
        for (r, c), b in frontier:
            for dr, dc in ((-1, 0), (1, 0), (0, -1), (0, 1)):
                to, beyond = (r + dr, c + dc), (r + 2 * dr, c + 2 * dc)
                if to in walls or (to in b and (beyond in walls or beyond in b)):
                    continue
                state = (to, b - {to} | {beyond} if to in b else b)
                if state not in seen:
                    seen.add(state)
                    nxt.append(state)
        frontier = nxt
    return None


def test_solver_agrees_with_unpruned_bfs():
    rooms = [sk.generate_task(seed, num_boxes=1 + seed % 2)["room"] for seed in range(40)]
    rooms.append(["######", "#.   #", "# $# #", "#  @ #", "######"])
    rooms.append(["#####", "#$ .#", "# @ #", "#####"])  # box stuck in a corner
    for rows in rooms:
        assert sk.shortest_solution(*sk.parse_xsb(rows), 25) == naive_solution_length(rows, 25)


def test_generated_rooms_are_6x6_unsolved_and_solvable():
    for seed in range(200):
        task = sk.generate_task(seed)
        rows = task["room"]
        assert len(rows) == 6 and all(len(row) == 6 for row in rows)
        assert rows[0] == rows[-1] == "######" and all(row[0] == row[-1] == "#" for row in rows)
        room, player, boxes = sk.parse_xsb(rows)
        assert not room.solved(boxes)
        length = sk.shortest_solution(room, player, boxes, task["max_steps"])
        assert length is not None and 4 <= length <= task["max_steps"]
    assert sk.generate_task(7) == sk.generate_task(7)


def test_size_and_box_count_are_configurable():
    env = make("sokoban", size=7, num_boxes=2)
    env.reset(3)
    assert len(env.task["room"]) == 7 and all(len(row) == 7 for row in env.task["room"])
    assert sum(row.count("$") + row.count("*") for row in env.task["room"]) == 2
    assert len(env.view()["boxes"]) == 2


def test_solution_solves_with_rewards():
    env = env_at()
    result = env.step("plan", "<answer>R R</answer>")
    assert env.success and env.done and env.global_reward == 1.0
    assert result.local_reward == pytest.approx(2 * sk.STEP_COST + sk.BOX_ON_TARGET + sk.SOLVED_REWARD)
    assert env.view()["room"][1] == "#  @*#"


def test_invalid_moves_penalised_state_unchanged():
    env = env_at()
    result = env.step("plan", "<answer>U L</answer>")
    assert result.local_reward == pytest.approx(2 * sk.INVALID_MOVE)
    assert env.view()["player"] == [1, 1] and env.view()["boxes"] == [[1, 2]]
    result = env.step("plan", "<answer>R R R</answer>")  # solved after two moves; the third is ignored
    assert env.success and result.info["moves"] == 2


def test_blocked_box_and_box_off_target():
    env = env_at({"room": ["######", "#@*$.#", "######"], "max_steps": 10})
    blocked = env.step("plan", "<answer>R</answer>")  # two boxes in a row cannot move
    assert blocked.local_reward == pytest.approx(sk.INVALID_MOVE) and env.view()["player"] == [1, 1]
    env = env_at({"room": ["######", "#@*  #", "#  $.#", "######"], "max_steps": 10})
    off = env.step("plan", "<answer>R</answer>")
    assert off.local_reward == pytest.approx(sk.STEP_COST + sk.BOX_OFF_TARGET)
    assert env.view()["boxes"] == [[1, 3], [2, 3]] and not env.success


def test_move_budget_ends_episode():
    env = env_at()  # budget 6
    env.step("plan", "<answer>D U D U D</answer>")
    assert not env.done and env.view()["moves_left"] == 1
    result = env.step("plan", "<answer>U R R</answer>")  # only U fits in the budget
    assert result.info["moves"] == 1 and env.done and not env.success


def test_prompt_shows_current_state():
    env = env_at()
    env.step("plan", "<answer>R</answer>")
    user = env.observation("plan")[1]["content"]
    assert "# @$.#" in user and "Player at (1, 2)" in user and "Boxes at (1, 3)" in user
    assert "Moves left: 5" in user


def test_global_reward_tracks_box_distance():
    env = env_at({"room": ["#######", "#@$  .#", "#######"], "max_steps": 10})
    assert env.global_reward == 0.0
    env.step("plan", "<answer>R</answer>")
    assert env.global_reward == pytest.approx(1 / 3)


def test_clones_are_independent():
    parent = env_at()
    first, second = parent.clone(), parent.clone()
    first.step("plan", "<answer>R R</answer>")
    assert first.success
    for env in (parent, second):
        assert env.view()["boxes"] == [[1, 2]] and env.steps_used == 0 and not env.done
    second.step("plan", "<answer>D</answer>")
    assert second.view()["player"] == [2, 1] and first.view()["player"] == [1, 3] and parent.view()["player"] == [1, 1]


def test_tool_actions_scored_on_clone_not_applied():
    env = env_at()
    before = env.view()
    program = "```python\nimport json, sys\nstate = json.load(sys.stdin)\nprint('R R' if state['player'] == [1, 1] else 'U')\n```"
    result = env.step("tool", program)
    assert env.view() == before and not env.success and env.steps_used == 0
    assert result.info["would_solve"]
    assert result.local_reward == pytest.approx(env_at().step("plan", "<answer>R R</answer>").local_reward)
    assert "R R" in env.observation("plan")[1]["content"]


replies = st.one_of(
    st.text(max_size=200),
    st.lists(st.sampled_from(["<answer>", "</answer>", "U", "left", "R", "```", "9" * 5000, "😀", "\n", " "]), max_size=30).map("".join),
)


@settings(max_examples=200, deadline=None)
@given(replies)
def test_fuzzed_replies_never_raise(text):
    env = env_at()
    moves = env.parse_actions(text)
    result = env.step("plan", text)
    if moves is None:
        assert result.local_reward == PARSE_PENALTY and env.view()["player"] == [1, 1]
    else:
        assert len(moves) <= env.max_steps and result.parse_ok
    assert 0.0 <= env.global_reward <= 1.0


def test_data_prep_writes_disjoint_splits(tmp_path):
    spec = importlib.util.spec_from_file_location("data_prep_sokoban", ROOT / "data_prep" / "sokoban.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    script.main(["--out-dir", str(tmp_path), "--train", "60", "--val", "10", "--test", "20"])
    train, val, test = (pd.read_parquet(tmp_path / f"{split}.parquet") for split in ("train", "val", "test"))
    assert (len(train), len(val), len(test)) == (60, 10, 20)
    rooms = {name: {row["task_json"] for row in frame["extra_info"]} for name, frame in (("train", train), ("val", val), ("test", test))}
    assert len(rooms["train"]) == 60 and not rooms["train"] & rooms["test"]
    assert not rooms["val"] & (rooms["train"] | rooms["test"])
    task = json.loads(test["extra_info"][0]["task_json"])
    assert len(task["room"]) == 6 and env_at(task).task == task
