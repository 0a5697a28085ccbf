"""Write Sokoban train/val/test parquet: ``python data_prep/sokoban.py --out-dir DIR``."""

from pettingllms_verl.data_prep.generated import split_counts, split_parser, write_generated


def main(argv=None) -> None:
    parser = split_parser(__doc__, "sokoban", "rooms", train=10_000, val=200, test=500)
    parser.add_argument("--size", type=int, default=6, help="room side length, outer walls included")
    parser.add_argument("--num-boxes", type=int, default=1, help="boxes (and targets) per room")
    parser.add_argument("--max-steps", type=int, default=20, help="move budget of an episode")
    args = parser.parse_args(argv)
    config = {"size": args.size, "num_boxes": args.num_boxes, "max_steps": args.max_steps}
    write_generated("sokoban", args.out_dir, split_counts(args), config, "rooms")


if __name__ == "__main__":
    main()
