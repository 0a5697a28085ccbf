"""Write Sudoku 4x4 train/val/test parquet: ``python data_prep/sudoku.py --out-dir DIR``.

Splits are disjoint by puzzle (not only by seed): a test puzzle that also occurs in train is skipped.
"""

import json

from pettingllms_verl.data_prep.generated import split_counts, split_parser, write_generated


def puzzle_key(task: dict) -> str:
    return json.dumps(task["puzzle"])


def main(argv=None) -> None:
    parser = split_parser(__doc__, "sudoku", "puzzles", train=10_000, val=200, test=500)
    parser.add_argument("--num-clues", type=int, default=6, help="clues left in each puzzle (fewer is harder)")
    args = parser.parse_args(argv)
    counts = split_counts(args)
    write_generated("sudoku", args.out_dir, counts, {"num_clues": args.num_clues}, "puzzles", key=puzzle_key)


if __name__ == "__main__":
    main()
