"""Write Hanabi train/val/test parquet: ``python data_prep/hanabi.py --out-dir DIR [--small]``.

A task is a seed plus the rule options and the resulting deal order; train and test seeds come
from disjoint ranges and a test deal that also occurs in train is skipped.
"""

from pettingllms_verl.data_prep.generated import split_counts, split_parser, write_generated
from pettingllms_verl.envs.hanabi.env import SMALL_DECK


def deal_key(task: dict) -> tuple:
    """Two tasks are the same game when rules and deal order agree (the seed is only a label)."""
    return tuple((key, tuple(value) if isinstance(value, list) else value) for key, value in sorted(task.items()) if key != "seed")


def main(argv=None) -> None:
    parser = split_parser(__doc__, "hanabi", "tasks", train=2_000, val=100, test=200)
    parser.add_argument("--small", action="store_true", help=f"small deck {SMALL_DECK} instead of the full game")
    args = parser.parse_args(argv)
    counts = split_counts(args)
    write_generated("hanabi", args.out_dir, counts, SMALL_DECK if args.small else {}, "tasks", key=deal_key)


if __name__ == "__main__":
    main()
