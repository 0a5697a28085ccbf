"""What the data scripts of the generated environments (Plan-Path, Sokoban, Sudoku, Tic-Tac-Toe,
Hanabi) share: their common options and the write of disjoint splits."""

from __future__ import annotations

import argparse
import os
from typing import Any
from collections.abc import Callable, Hashable

from pettingllms_verl.data.rows import write_parquet
from pettingllms_verl.envs.splits import generate_splits, task_key


def split_parser(doc: str, env: str, noun: str, train: int, val: int, test: int) -> argparse.ArgumentParser:
    """``--out-dir``, ``--train``, ``--val``, ``--test``, ``--confirm``, ``--final``; the script adds its env's options."""
    parser = argparse.ArgumentParser(description=doc)
    parser.add_argument("--out-dir", default=f"data/{env}", help="directory for the parquet files (train, val, test)")
    parser.add_argument("--train", type=int, default=train, help=f"number of training {noun}")
    parser.add_argument("--val", type=int, default=val, help=f"number of validation {noun} (to choose checkpoints on)")
    parser.add_argument("--test", type=int, default=test, help=f"number of test {noun}")
    parser.add_argument("--confirm", type=int, default=0,
                        help=f"number of confirmation {noun}: a second test split, never used to choose anything (0: none)")
    parser.add_argument("--final", type=int, default=0,
                        help=f"number of final confirmation {noun}: a third test split, read for a declared primary claim alone (0: none)")
    return parser


def split_counts(args: argparse.Namespace) -> dict[str, int]:
    """split -> tasks asked for by ``split_parser``'s options (the confirmation splits only when asked)."""
    counts = {"train": args.train, "val": args.val, "test": args.test}
    return {**counts, **{split: n for split, n in (("confirm", args.confirm), ("final", args.final)) if n}}


def write_generated(
    env: str, out_dir: str, counts: dict[str, int], config: dict[str, Any], noun: str,
    key: Callable[[dict], Hashable] = task_key, name: str | None = None,
) -> None:
    """Generate disjoint splits (``counts``: split -> tasks) and write each as ``<out_dir>/<split>.parquet``
    (with ``name``: one split, written as ``<out_dir>/<name>.parquet``)."""
    for split, rows in generate_splits(env, counts, config, key=key).items():
        path = os.path.join(out_dir, f"{name or split}.parquet")
        print(f"wrote {write_parquet(rows, path)} {name or split} {noun} to {path}")
