"""Programming problems solved by a team: a tester that writes unit tests and a coder that writes
a stdin/stdout program (problems of the APPS, CodeContests, LiveCodeBench kind) or a function
(problems of the HumanEval kind).

Task: ``{"problem": str, "tests": [...], "solution": str | None}``: the ground-truth tests (never
shown to either role) and, where the dataset has one, a reference solution. A test is either
``{"input": str, "output": str}`` (the program's stdin and expected stdout, compared token by token,
whitespace-insensitive) or ``{"check": str}`` (Python run after the program, e.g. HumanEval's
``check(candidate)``: it passes when the whole exits cleanly after the check ran to its end, which a
line of random text printed after it shows: a program that exits early, ``exit(0)`` or
``os._exit(0)``, passes nothing; a check must not exit itself). A check reads what the problem's
functions return as a plain copy (``PLAIN_DATA``): an object whose ``__eq__`` says yes to anything
passes nothing. A task with check tests is a
*function* problem: the coder writes the function, and the tester's tests are calls of it (of a
function or class the problem defines, where it defines one) with the Python literals they must
return. Every program runs in the sandbox, one process per test.

Roles. MAS, each turn: ``tester`` then ``coder`` (tests first, as in test-driven development).
- tester: ``<input>..</input><output>..</output>`` pairs (in a function problem, a pair that is not
  a call and a literal is not read: ``1 == 1`` tests nothing). Local reward: the fraction of its tests
  whose expected output is what the reference solution prints for that input (a reference that
  crashes on the input fails the test too); without a reference solution in the task, the coder's
  last program stands in once it passes every ground-truth test, and until then the reward is 0.
  ``PARSE_PENALTY`` for a reply without a test.
- coder: sees the problem, the tester's tests and, from the second turn on, which of them its last
  program failed. Local reward: pass rate on the ground-truth tests (all of them, always);
  ``PARSE_PENALTY`` without a ```python block.
After the coder's program, it runs on the tester's tests; the MAS episode ends when it passes all
of them, or after ``max_turns`` turns. SA is the coder alone: the episode ends at its first
program (one attempt), or after ``max_turns`` replies without one.

Team (global) reward: the ground-truth pass rate of the latest program. Success: it passes all.
Without a task, ``reset(seed)`` takes problem ``seed % N`` of the small fixture shipped with the package.
"""

from __future__ import annotations

import ast
import functools
import re
import secrets
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, ClassVar
from collections.abc import Sequence

from pettingllms_verl.envs.base import PARSE_PENALTY, Env, StepResult, Workflow, fixture_task, ignored, sandbox_runs, workflow_for
from pettingllms_verl.envs.code import prompts
from pettingllms_verl.envs.text import Messages, extract_code, parse_io_tests
from pettingllms_verl.sandbox import SandboxLimits, run_python
from pettingllms_verl.sandbox.client import MAX_PARALLEL

DEFAULT_MAX_TURNS = 3
FIXTURE = "code_fixture.jsonl"  # the offline problem set shipped with the package (reference solutions, tests from running them)
DEFAULT_MAX_TESTS = 5  # tests read from one tester reply
MAX_TEST_CHARS = 2000  # a tester's input or expected output longer than this is skipped
# Sandbox limits of one program on one test; override with the env config key "test_limits".
DEFAULT_TEST_LIMITS = {"wall_s": 4.0, "cpu_s": 2, "memory_mb": 512, "max_output_bytes": 65_536}

# Tests of one program run concurrently; the sandbox server caps how many run at once.
_runner = ThreadPoolExecutor(max_workers=MAX_PARALLEL, thread_name_prefix="code-tests")


@dataclass(frozen=True)
class Check:
    """A test that is Python run after the program; it passes when the whole exits cleanly."""

    code: str
    functions: frozenset[str] = frozenset()  # the problem's functions: what they return is read as plain data
    classes: frozenset[str] = frozenset()  # the problem's classes: what their objects' methods return, the same
    helpers: str = ""  # the problem's own whole functions (HumanEval's poly, encode_cyclic), defined again before the check


# What a check reads of the program must be plain data. An object of the program's own class can answer
# every comparison with yes (``__eq__``, ``__sub__``...), the reward hack that needs no knowledge of the
# grader; so each value a check takes from the problem's functions is replaced by a plain copy first:
# built-in numbers, strings, bytes, None, and lists, tuples, dicts and sets of them, of exactly those
# types. A subclass of one (a ``Counter``, a ``namedtuple``, an ``IntEnum``, numpy's ``float64``) is copied
# into its built-in base by that base's own C methods, which run none of its code; a number of a compiled
# library (numpy's ``int64``) becomes the int or float it converts to; any other object fails the test.
# The check then compares the copy, which no later call of the program can change. Defined after the
# program, with the built-in types taken from literals and the type's own descriptors, so that a program
# rebinding ``type``, ``frozenset`` or ``isinstance`` does not reach it. It runs in the program's process:
# it stops the plain hacks, not a program that rewrites the interpreter's state.
PLAIN_DATA = """
class _NotPlainData(BaseException):  # not an Exception: a check's own `except Exception` does not swallow it
    pass


def _pettingllms_plain(value, _type=(0).__class__.__class__, _int=(0).__class__, _float=(0.0).__class__,
                       _complex=(0j).__class__, _str="".__class__, _bytes=b"".__class__, _list=[].__class__,
                       _tuple=().__class__, _dict={}.__class__, _set={0}.__class__, _bool=True.__class__, _none=None.__class__,
                       _whole=(0).__class__.__class__("", (), {"__getitem__": lambda self, key: key})()[:]):
    kind = _type(value)
    for plain in (_bool, _none, _int, _float, _complex, _str, _bytes):
        if kind is plain:
            return value
    if kind is _list:
        return [_pettingllms_plain(item) for item in value]
    if kind is _tuple:
        return (*[_pettingllms_plain(item) for item in value],)
    if kind is _dict:
        return {_pettingllms_plain(key): _pettingllms_plain(item) for key, item in _dict.items(value)}
    if kind is _set:
        return {_pettingllms_plain(item) for item in value}
    compiled = not _type.__dict__["__flags__"].__get__(kind) & 512  # a static type: built in or compiled, not a class of the program
    ancestors = _type.__dict__["__mro__"].__get__(kind)
    copies = ((_int, _int.__pos__), (_float, _float.__pos__), (_complex, _complex.__pos__), (_str, _str.__str__),
              (_bytes, lambda b: _bytes.__getitem__(b, _whole)), (_list, _list.copy),
              (_tuple, lambda t: _tuple.__getitem__(t, _whole)), (_dict, _dict.copy), (_set, _set.copy))
    for ancestor in ancestors:
        if not _type.__dict__["__flags__"].__get__(ancestor) & 512 and _type.__dict__["__name__"].__get__(ancestor) == "frozenset":
            return ancestor(_pettingllms_plain(item) for item in ancestor.copy(value))  # the built-in frozenset (copy: no code of a subclass)
        for base, copy in copies:
            if ancestor is base:
                return _pettingllms_plain(copy(value))
    if compiled:
        for ancestor in ancestors:
            if "__index__" in _type.__dict__["__dict__"].__get__(ancestor):
                return _int(value)
        for ancestor in ancestors:
            if "__float__" in _type.__dict__["__dict__"].__get__(ancestor):
                return _float(value)
    raise _NotPlainData("returned an object of class " + repr(_type.__dict__["__name__"].__get__(kind)) + ", where the test reads"
                        " plain data (built-in numbers, strings, bytes, None, and lists, tuples, dicts and sets of them)")


def _pettingllms_returns_plain(function, _plain=_pettingllms_plain):
    def checked(*args, **kwargs):
        return _plain(function(*args, **kwargs))
    try:
        checked.__name__, checked.__qualname__, checked.__doc__ = function.__name__, function.__qualname__, function.__doc__
    except Exception:
        pass
    return checked
"""


def parsed(code: str) -> ast.Module | None:
    """``code`` as a whole Python module, or None where Python cannot read it (untrusted text: a null
    byte, nesting too deep for the parser). A program that does not parse on its own (a decorator left
    dangling) would take the check run after it into its last construct."""
    try:
        return ast.parse(code)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None


class _ReadsPlain(ast.NodeTransformer):
    """A check's code with each call of the problem's functions, and of a method of an object one of its
    classes makes (``C(...).m(...)``), wrapped in ``_pettingllms_plain``, and each of its functions passed
    as a value (``check(candidate)``) in ``_pettingllms_returns_plain``."""

    def __init__(self, functions: frozenset[str], classes: frozenset[str]) -> None:
        self.functions, self.classes = functions, classes

    def visit_Call(self, node: ast.Call) -> ast.AST:
        func = node.func
        if not isinstance(func, ast.Name):  # a called name is read by the call's own wrapping below
            node.func = self.visit(func)
        node.args = [self.visit(arg) for arg in node.args]
        node.keywords = [self.visit(keyword) for keyword in node.keywords]
        method_of_object = (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Call)
                            and isinstance(func.value.func, ast.Name) and func.value.func.id in self.classes)
        if (isinstance(func, ast.Name) and func.id in self.functions) or method_of_object:
            return ast.Call(ast.Name("_pettingllms_plain", ast.Load()), [node], [])
        return node

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        return node if isinstance(node.value, ast.Name) else self.generic_visit(node)  # f.cache_clear(): f itself

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if isinstance(node.ctx, ast.Load) and node.id in self.functions:
            return ast.Call(ast.Name("_pettingllms_returns_plain", ast.Load()), [node], [])
        return node


@functools.lru_cache(maxsize=1024)
def reads_plain(check: Check) -> str:
    """The check's code as it runs after ``PLAIN_DATA``: what it reads of the problem's functions and
    classes checked to be plain data. A check Python cannot parse runs as written (it fails whatever
    the program)."""
    tree = parsed(check.code) if check.functions or check.classes else None
    if tree is None:
        return check.code
    try:
        return ast.unparse(ast.fix_missing_locations(_ReadsPlain(check.functions, check.classes).visit(tree)))
    except RecursionError:  # a check nested too deep to print back
        return check.code


Test = tuple[str, str] | Check  # (stdin, expected stdout), or a check


def call_check(call: str, expected: str) -> Check:
    """A tester's test of a function problem (an ``is_call_test`` pair): ``call`` must return
    ``expected``; both as Python reads them, so that a comment in either ends nothing but itself."""
    call, expected = (ast.unparse(ast.parse(text.strip(), mode="eval")) for text in (call, expected))
    return Check(f"\n\n_pettingllms_value = _pettingllms_plain({call})\n"
                 f"assert _pettingllms_value == ({expected}), 'returned ' + repr(_pettingllms_value)\n")


def defined_functions(problem: str) -> frozenset[str]:
    """The functions and classes a function problem's text defines (HumanEval's prompt: the signature to complete)."""
    return frozenset(re.findall(r"^[ \t]*(?:def|class)[ \t]+([A-Za-z_]\w*)", problem, re.M))


def is_call_test(call: str, expected: str, functions: frozenset[str]) -> bool:
    """A tester's pair as a function problem's prompt asks for it: a call of one of ``functions``
    (``f(...)``, or a method of a class's object, ``C(...).m(...)``; any named function where the
    problem defines none) and the Python literal it must return."""
    try:
        tree = ast.parse(call.strip(), mode="eval").body
        ast.literal_eval(expected.strip())
        call_check(call, expected)  # printed back as it runs: a parse too deep for that (f(1+1+...+1)) is no test
    except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError):
        return False
    if isinstance(tree, ast.Call) and isinstance(tree.func, ast.Attribute) and isinstance(tree.func.value, ast.Call):
        tree = tree.func.value  # C(...).m(...): the object's class
    return isinstance(tree, ast.Call) and isinstance(tree.func, ast.Name) and (not functions or tree.func.id in functions)


@dataclass(frozen=True)
class TestOutcome:
    passed: bool
    status: str  # the sandbox status of the run ("ok", "error", "timeout", ...)
    stdout: str


def same_output(got: str, expected: str) -> bool:
    return got.split() == expected.split()


def run_tests(code: str, tests: Sequence[Test], limits: SandboxLimits) -> list[TestOutcome]:
    """Run ``code`` once per test, in the sandbox, concurrently: on a (stdin, expected stdout) pair,
    or followed by a check's code. A failed check's "stdout" is the last line of its stderr (the
    assertion or error that stopped it)."""

    parses_alone = any(isinstance(test, Check) for test in tests) and parsed(code) is not None

    def one(test: Test) -> TestOutcome:
        if isinstance(test, Check):
            if not parses_alone:
                return TestOutcome(False, "error", "SyntaxError: the program does not parse on its own")
            ran = "\n" + secrets.token_hex(16)  # a line printed once the check has run: a program that exits early never prints it
            run = run_python(f"{code}\n{PLAIN_DATA}\n{test.helpers}\n{reads_plain(test)}\nprint({ran!r})\n", stdin="", limits=limits)
            if run.ok and ran[1:] not in run.stdout.splitlines():
                return TestOutcome(False, run.status, "the program exited before the test ran")
            last = run.stderr.strip().splitlines()[-1:] if not run.ok else []
            return TestOutcome(run.ok, run.status, last[0] if last else run.stdout.replace(ran + "\n", "", 1))
        run = run_python(code, stdin=test[0], limits=limits)
        return TestOutcome(run.ok and same_output(run.stdout, test[1]), run.status, run.stdout)

    return list(_runner.map(one, tests))


def problem_helpers(problem: str) -> str:
    """The whole functions a function problem's text gives (a body beyond a docstring, imports, ``pass`` or ``...``),
    with its imports: a check may call them (HumanEval's ``poly``), so they are defined again after the
    program, which cannot pass a check by defining them anew. The functions to write (a signature and a
    docstring) and the classes are the program's. Empty for a text Python cannot read."""
    tree = parsed(problem)
    if tree is None:
        return ""

    def stub(statement: ast.stmt) -> bool:  # HumanEval/115's function to write imports math before its docstring
        return isinstance(statement, (ast.Pass, ast.Import, ast.ImportFrom)) or (isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant)
                                                   and (statement.value.value is Ellipsis or isinstance(statement.value.value, str)))

    whole = [node for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not all(map(stub, node.body))]
    if not whole:
        return ""
    try:
        return ast.unparse(ast.Module([node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))] + whole, []))
    except RecursionError:
        return ""


def task_test(test: dict, problem: str) -> Test:
    """A task's test as it runs; a check reads what the problem's top-level functions and classes give as plain data."""
    if "check" in test:
        functions, classes = (frozenset(re.findall(rf"^{kind}[ \t]+([A-Za-z_]\w*)", problem, re.M)) for kind in ("def", "class"))
        return Check(str(test["check"]), functions, classes, problem_helpers(problem))
    return str(test["input"]), str(test["output"])


class CodeEnv(Env):
    name: ClassVar[str] = "code"
    roles: ClassVar[tuple[str, ...]] = ("tester", "coder")
    runs_model_code: ClassVar[bool] = True
    # clone: Env's shallow copy (every per-episode field is immutable: str, tuples, numbers)

    options = {
        "max_turns": "turns per episode (each turn: every role of the workflow acts once)",
        "max_tests": "tester's tests run per program at most",
        "test_limits": "sandbox limits of each program run (SandboxLimits fields)",
    }

    def __init__(self, **config: Any) -> None:
        super().__init__(**config)
        self.max_turns = int(config.get("max_turns", DEFAULT_MAX_TURNS))
        self.max_tests = int(config.get("max_tests", DEFAULT_MAX_TESTS))
        self.test_limits = SandboxLimits(**{**DEFAULT_TEST_LIMITS, **config.get("test_limits", {})})

    def reset(self, seed: int, task: dict | None = None) -> None:
        task = fixture_task(FIXTURE, seed) if task is None else task
        tests = task.get("tests")
        if not isinstance(task.get("problem"), str) or not tests:
            raise ValueError(f"code task needs a 'problem' string and a non-empty 'tests' list, got keys {sorted(task)}")
        self.problem = task["problem"]
        self.ground_truth: tuple[Test, ...] = tuple(task_test(t, self.problem) for t in tests)
        self.function = any(isinstance(t, Check) for t in self.ground_truth)  # a function problem: tests are calls
        self.functions = defined_functions(self.problem)  # what a tester's call must call
        self.solution: str | None = task.get("solution") or None
        self.done = self.success = self.truncated = False
        self.turn = 0
        self.code: str | None = None  # the coder's latest program
        self.pass_rate = 0.0  # its ground-truth pass rate
        self.tests: tuple[tuple[str, str], ...] = ()  # the tester's latest tests
        self.mismatches: tuple[dict, ...] = ()  # the tester's tests the latest program failed
        self.tester_acted = False  # the tester steps first every MAS turn, never in SA

    @property
    def task(self) -> dict:
        tests = [{"check": t.code} if isinstance(t, Check) else {"input": t[0], "output": t[1]} for t in self.ground_truth]
        return {"problem": self.problem, "tests": tests, "solution": self.solution}

    def _runnable(self, tests: Sequence[tuple[str, str]]) -> tuple[Test, ...]:
        """The tester's (input, output) pairs as run: a call and its value in a function problem."""
        return tuple(call_check(*test) for test in tests) if self.function else tuple(tests)

    @property
    def global_reward(self) -> float:
        return self.pass_rate

    # workflow, observation and step: the Env contract's per-role dispatch, alike in shape across the
    # two-role envs and kept in each so that an env's rules read top to bottom in one file
    def workflow(self, mode: str) -> Workflow:
        return workflow_for(mode, mas=("tester", "coder"), sa=("coder",), max_turns=self.max_turns)

    def observation(self, role: str) -> Messages:
        if role == "tester":
            return prompts.tester_messages(self.problem, self.max_tests, self.code, self.mismatches, self.function)
        if role == "coder":
            return prompts.coder_messages(self.problem, self.tests, self.code, self.mismatches, self.function)
        raise self.unknown_role(role)

    def step(self, role: str, text: str) -> StepResult:
        self.check_role(role)
        if self.done:
            return ignored("episode is done")
        return self._tester_step(text) if role == "tester" else self._coder_step(text)

    def _tester_step(self, text: str) -> StepResult:
        self.tester_acted = True
        tests = parse_io_tests(text, self.max_tests, MAX_TEST_CHARS)
        if self.function:
            tests = [test for test in tests if is_call_test(*test, self.functions)]
        if not tests:
            return StepResult(PARSE_PENALTY, False, {})
        self.tests = tuple(tests)
        reference = self.solution or (self.code if self.success else None)
        if reference is None:
            return StepResult(0.0, True, {"tests": len(tests), "reference": "none"})
        outcomes = run_tests(reference, self._runnable(tests), self.test_limits)
        agree = sum(outcome.passed for outcome in outcomes)
        info = {"tests": len(tests), "agree_with_reference": agree, **sandbox_runs(o.status for o in outcomes)}
        return StepResult(agree / len(tests), True, info)

    def _coder_step(self, text: str) -> StepResult:
        code = extract_code(text)
        self.turn += 1
        if code is None:
            self.done = self.truncated = self.turn >= self.max_turns
            return StepResult(PARSE_PENALTY, False, {})
        outcomes = run_tests(code, self.ground_truth + self._runnable(self.tests), self.test_limits)
        truth, own = outcomes[: len(self.ground_truth)], outcomes[len(self.ground_truth) :]
        self.code = code
        self.pass_rate = sum(o.passed for o in truth) / len(truth)
        self.success = all(o.passed for o in truth)
        self.mismatches = tuple(
            {"input": stdin, "expected": stdout, "got": o.stdout if o.status == "ok" else f"[{o.status}] {o.stdout}"}
            for (stdin, stdout), o in zip(self.tests, own)
            if not o.passed
        )
        # MAS: done once the program passes the tester's tests; SA: the first program is final
        ended = (bool(self.tests) and not self.mismatches) or not self.tester_acted
        self.truncated = not ended and self.turn >= self.max_turns
        self.done = ended or self.truncated
        info = {"passed": sum(o.passed for o in truth), "tester_failed": len(self.mismatches), **sandbox_runs(o.status for o in outcomes)}
        return StepResult(self.pass_rate, True, info)
