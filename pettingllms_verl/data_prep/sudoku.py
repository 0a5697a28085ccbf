"""Write Sudoku 4x4 train/val/test parquet: ``python data_prep/sudoku.py --out-dir DIR``.

Splits are disjoint by puzzle (not only by seed): a test puzzle that also occurs in train is skipped.
"""

import argparse
import json
import os

from pettingllms_verl.data.rows import write_parquet
from pettingllms_verl.envs.splits import generate_splits


def puzzle_key(task: dict) -> str:
    return json.dumps(task["puzzle"])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out-dir", default="data/sudoku", help="directory for train.parquet, val.parquet and test.parquet")
    parser.add_argument("--train", type=int, default=10_000, help="number of training puzzles")
    parser.add_argument("--val", type=int, default=200, help="number of validation puzzles (to choose checkpoints on)")
    parser.add_argument("--test", type=int, default=500, help="number of test puzzles")
    parser.add_argument("--num-clues", type=int, default=6, help="clues left in each puzzle (fewer is harder)")
    args = parser.parse_args(argv)
    splits = generate_splits("sudoku", {"train": args.train, "val": args.val, "test": args.test}, {"num_clues": args.num_clues}, key=puzzle_key)
    for split, rows in splits.items():
        path = os.path.join(args.out_dir, f"{split}.parquet")
        print(f"wrote {write_parquet(rows, path)} {split} puzzles to {path}")


if __name__ == "__main__":
    main()
