"""Write Tic-Tac-Toe train/val/test parquet: ``python data_prep/tictactoe.py --out-dir DIR``.

A task is a seed (it drives the fixed opponent and who starts) plus options; the board always
starts empty. ``test.parquet`` faces the random opponent, ``test_minimax.parquet`` the same test
seeds against perfect play (a draw is the best result there).
"""

import argparse
import os

from pettingllms_verl.data.rows import write_parquet
from pettingllms_verl.envs.splits import generate_splits


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out-dir", default="data/tictactoe", help="directory for the parquet files")
    parser.add_argument("--train", type=int, default=2_000, help="number of training tasks")
    parser.add_argument("--val", type=int, default=100, help="number of validation tasks (random opponent; to choose checkpoints on)")
    parser.add_argument("--test", type=int, default=200, help="number of test tasks per opponent")
    parser.add_argument("--first", default="random", choices=("x", "o", "random"), help="who starts")
    parser.add_argument("--train-opponent", default="random", choices=("random", "minimax"), help="sa opponent in train")
    args = parser.parse_args(argv)
    jobs = [
        ("train", {"train": args.train}, args.train_opponent),
        ("val", {"val": args.val}, "random"),
        ("test", {"test": args.test}, "random"),
        ("test_minimax", {"test": args.test}, "minimax"),
    ]
    for name, counts, opponent in jobs:
        rows = generate_splits("tictactoe", counts, {"first": args.first, "opponent": opponent})
        path = os.path.join(args.out_dir, f"{name}.parquet")
        print(f"wrote {write_parquet(next(iter(rows.values())), path)} {name} tasks to {path}")


if __name__ == "__main__":
    main()
