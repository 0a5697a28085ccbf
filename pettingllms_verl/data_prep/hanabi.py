"""Write Hanabi train/val/test parquet: ``python data_prep/hanabi.py --out-dir DIR [--small]``.

A task is a seed plus the rule options and the resulting deal order; train and test seeds come
from disjoint ranges and a test deal that also occurs in train is skipped.
"""

import argparse
import os

from pettingllms_verl.data.rows import write_parquet
from pettingllms_verl.envs.hanabi.env import SMALL_DECK
from pettingllms_verl.envs.splits import generate_splits


def deal_key(task: dict) -> tuple:
    """Two tasks are the same game when rules and deal order agree (the seed is only a label)."""
    return tuple((key, tuple(value) if isinstance(value, list) else value) for key, value in sorted(task.items()) if key != "seed")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out-dir", default="data/hanabi", help="directory for train.parquet, val.parquet and test.parquet")
    parser.add_argument("--train", type=int, default=2_000, help="number of training tasks")
    parser.add_argument("--val", type=int, default=100, help="number of validation tasks (to choose checkpoints on)")
    parser.add_argument("--test", type=int, default=200, help="number of test tasks")
    parser.add_argument("--small", action="store_true", help=f"small deck {SMALL_DECK} instead of the full game")
    args = parser.parse_args(argv)
    splits = generate_splits("hanabi", {"train": args.train, "val": args.val, "test": args.test}, SMALL_DECK if args.small else {}, key=deal_key)
    for split, rows in splits.items():
        path = os.path.join(args.out_dir, f"{split}.parquet")
        print(f"wrote {write_parquet(rows, path)} {split} tasks to {path}")


if __name__ == "__main__":
    main()
