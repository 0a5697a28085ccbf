"""Write the CPU quickstart dataset (train/test parquet): ``python data_prep/quickstart.py --out-dir DIR``."""

import argparse
import os

from pettingllms_verl.data.quickstart import rows
from pettingllms_verl.data.rows import write_parquet


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out-dir", required=True, help="directory for train.parquet and test.parquet")
    parser.add_argument("--train", type=int, default=64, help="number of training prompts")
    parser.add_argument("--test", type=int, default=8, help="number of test prompts")
    parser.add_argument("--seed", type=int, default=0, help="seed of the train split (test uses seed + 1)")
    args = parser.parse_args(argv)
    for split, count, seed in (("train", args.train, args.seed), ("test", args.test, args.seed + 1)):
        path = os.path.join(args.out_dir, f"{split}.parquet")
        print(f"wrote {write_parquet(rows(count, seed, split), path)} {split} rows to {path}")


if __name__ == "__main__":
    main()
