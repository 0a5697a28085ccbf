"""Write the relay's train/val parquet: ``relay-data --out-dir DIR`` (or ``python -m relay_env.data_prep``).

Rows name the environment ``relay``; the recipe (``pettingllms.envs``) or this package's entry point
tells every rollout worker which class that is.
"""

import argparse
import os

from pettingllms_verl.data.rows import write_parquet
from pettingllms_verl.envs.splits import generate_splits

ENV_NAME = "relay"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out-dir", required=True, help="directory for train.parquet and val.parquet")
    parser.add_argument("--train", type=int, default=64, help="number of training tasks")
    parser.add_argument("--val", type=int, default=8, help="number of validation tasks")
    args = parser.parse_args(argv)
    from pettingllms_verl import envs

    envs.register_env(ENV_NAME, "relay_env.env:RelayEnv")  # found here without installing the package too
    for split, rows in generate_splits(ENV_NAME, {"train": args.train, "val": args.val}).items():
        path = os.path.join(args.out_dir, f"{split}.parquet")
        print(f"wrote {write_parquet(rows, path)} {split} tasks to {path}")


if __name__ == "__main__":
    main()
