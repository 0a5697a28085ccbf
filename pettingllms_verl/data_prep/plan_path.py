"""Write Plan-Path train/val/test parquet: ``python data_prep/plan_path.py --out-dir DIR``."""

from pettingllms_verl.data_prep.generated import split_counts, split_parser, write_generated


def main(argv=None) -> None:
    parser = split_parser(__doc__, "plan_path", "tasks", train=10_000, val=200, test=500)
    parser.add_argument("--size", type=int, default=10, help="grid side length")
    parser.add_argument("--wall-density", type=float, default=0.22, help="fraction of cells that are walls")
    parser.add_argument("--max-optimal-len", type=int, default=None, help="longest shortest path a task may have (default: no limit)")
    args = parser.parse_args(argv)
    counts = split_counts(args)
    config = {"size": args.size, "wall_density": args.wall_density}
    if args.max_optimal_len is not None:
        config["max_optimal_len"] = args.max_optimal_len
    write_generated("plan_path", args.out_dir, counts, config, "tasks")


if __name__ == "__main__":
    main()
