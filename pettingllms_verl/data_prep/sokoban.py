"""Write Sokoban train/val/test parquet: ``python data_prep/sokoban.py --out-dir DIR``."""

import argparse
import os

from pettingllms_verl.data.rows import write_parquet
from pettingllms_verl.envs.splits import generate_splits


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out-dir", default="data/sokoban", help="directory for train.parquet, val.parquet and test.parquet")
    parser.add_argument("--train", type=int, default=10_000, help="number of training rooms")
    parser.add_argument("--val", type=int, default=200, help="number of validation rooms (to choose checkpoints on)")
    parser.add_argument("--test", type=int, default=500, help="number of test rooms")
    parser.add_argument("--size", type=int, default=6, help="room side length, outer walls included")
    parser.add_argument("--num-boxes", type=int, default=1)
    parser.add_argument("--max-steps", type=int, default=20, help="move budget of an episode")
    args = parser.parse_args(argv)
    config = {"size": args.size, "num_boxes": args.num_boxes, "max_steps": args.max_steps}
    splits = generate_splits("sokoban", {"train": args.train, "val": args.val, "test": args.test}, config)
    for split, rows in splits.items():
        path = os.path.join(args.out_dir, f"{split}.parquet")
        print(f"wrote {write_parquet(rows, path)} {split} rooms to {path}")


if __name__ == "__main__":
    main()
