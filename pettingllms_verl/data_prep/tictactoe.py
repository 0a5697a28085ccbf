"""Write Tic-Tac-Toe train/val/test parquet: ``python data_prep/tictactoe.py --out-dir DIR``.

A task is a seed (it drives the fixed opponent and who starts) plus options; the board always
starts empty. ``test.parquet`` faces the random opponent, ``test_minimax.parquet`` the same test
seeds against perfect play (a draw is the best result there).
"""

from pettingllms_verl.data_prep.generated import split_parser, write_generated


def main(argv=None) -> None:
    parser = split_parser(__doc__, "tictactoe", "tasks", train=2_000, val=100, test=200)
    parser.add_argument("--first", default="random", choices=("x", "o", "random"), help="who starts")
    parser.add_argument("--train-opponent", default="random", choices=("random", "minimax"), help="sa opponent in train")
    args = parser.parse_args(argv)
    jobs = [
        ("train", {"train": args.train}, args.train_opponent),
        ("val", {"val": args.val}, "random"),
        ("test", {"test": args.test}, "random"),
        ("test_minimax", {"test": args.test}, "minimax"),
    ] + [(split, {split: n}, "random") for split, n in (("confirm", args.confirm), ("final", args.final)) if n]
    for name, counts, opponent in jobs:
        write_generated("tictactoe", args.out_dir, counts, {"first": args.first, "opponent": opponent}, "tasks", name=name)


if __name__ == "__main__":
    main()
