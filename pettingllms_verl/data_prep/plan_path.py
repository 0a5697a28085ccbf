"""Write Plan-Path train/val/test parquet: ``python data_prep/plan_path.py --out-dir DIR``."""

import argparse
import os

from pettingllms_verl.data.rows import write_parquet
from pettingllms_verl.envs.splits import generate_splits


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out-dir", default="data/plan_path", help="directory for train.parquet, val.parquet and test.parquet")
    parser.add_argument("--train", type=int, default=10_000, help="number of training tasks")
    parser.add_argument("--val", type=int, default=200, help="number of validation tasks (to choose checkpoints on)")
    parser.add_argument("--test", type=int, default=500, help="number of test tasks")
    parser.add_argument("--size", type=int, default=10, help="grid side length")
    parser.add_argument("--wall-density", type=float, default=0.22)
    args = parser.parse_args(argv)
    config = {"size": args.size, "wall_density": args.wall_density}
    splits = generate_splits("plan_path", {"train": args.train, "val": args.val, "test": args.test}, config)
    for split, rows in splits.items():
        path = os.path.join(args.out_dir, f"{split}.parquet")
        print(f"wrote {write_parquet(rows, path)} {split} tasks to {path}")


if __name__ == "__main__":
    main()
