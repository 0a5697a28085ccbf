"""Data-parallel balancing of AT-GRPO batches: verl's row balancing vs whole groups per rank.

A batch like a multi-agent step's: groups of K rows that share one prompt (the K branches of a
tree node), prompts of 200-320 tokens, replies of 10-48, plus singleton rows. For each
data-parallel size it prints, for verl's balancing (``get_seqlen_balanced_partitions``, equal
row counts) and for the trainer's (``shared_prefix.ranks_of_groups``): the groups spread over
more than one rank, the tokens the shared-prefix forward runs as a fraction of the plain tokens
(a prompt is run once per rank that holds rows of its group), and the workload imbalance
(max / mean rank workload, verl's quadratic workload estimate). No model, no training.

    .venv/bin/python benchmarks/bench_dp_groups.py [--groups 64] [--k 4] [--out benchmarks/results/dp_groups.json]
"""

import argparse
import json
import os
import random

import torch
from verl.utils.seqlen_balancing import calculate_workload, get_seqlen_balanced_partitions

from pettingllms_verl.trainer.shared_prefix import ranks_of_groups


def make_batch(groups: int, k: int, singletons: int, seed: int) -> tuple[list[list[int]], list[int], list[int]]:
    """(groups as row lists, prompt length per row, sequence length per row)."""
    rng = random.Random(seed)
    rows, prompt_lens, seq_lens = [], [], []
    for size in [k] * groups + [1] * singletons:
        prompt = rng.randint(200, 320)
        rows.append(list(range(len(seq_lens), len(seq_lens) + size)))
        for _ in range(size):
            prompt_lens.append(prompt)
            seq_lens.append(prompt + rng.randint(10, 48))
    return rows, prompt_lens, seq_lens


def measure(partitions, groups, prompt_lens, seq_lens, workloads) -> dict:
    rank = {row: r for r, rows in enumerate(partitions) for row in rows}
    spread = sum(len({rank[row] for row in group}) > 1 for group in groups if len(group) > 1)
    shared = sum(
        prompt_lens[group[0]] * len({rank[row] for row in group}) + sum(seq_lens[row] - prompt_lens[row] for row in group)
        for group in groups
    )
    loads = [sum(workloads[row] for row in rows) for rows in partitions]
    return {
        "groups_spread": spread,
        "token_frac": shared / sum(seq_lens),
        "imbalance": max(loads) / (sum(loads) / len(loads)),
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", type=int, default=64, help="groups of K rows in the batch")
    parser.add_argument("--k", type=int, default=4, help="rows per group (branches per tree node)")
    parser.add_argument("--singletons", type=int, default=8, help="rows of a group of their own")
    parser.add_argument("--dp", type=int, nargs="+", default=[1, 2, 4, 8], help="data-parallel sizes")
    parser.add_argument("--seed", type=int, default=0, help="seed of the lengths")
    parser.add_argument("--out", default="benchmarks/results/dp_groups.json", help="where the JSON goes")
    args = parser.parse_args(argv)
    groups, prompt_lens, seq_lens = make_batch(args.groups, args.k, args.singletons, args.seed)
    workloads = calculate_workload(torch.tensor(seq_lens)).tolist()
    results = []
    print(f"{len(seq_lens)} rows: {args.groups} groups of {args.k}, {args.singletons} singletons")
    print(f"{'dp':>3} | {'balancing':<10} | {'groups spread':>13} | {'token frac':>10} | {'imbalance':>9}")
    for dp in args.dp:
        if len(seq_lens) % dp:
            print(f"{dp:>3} | skipped: {len(seq_lens)} rows do not split evenly")
            continue
        verl = get_seqlen_balanced_partitions(workloads, k_partitions=dp, equal_size=True)
        ours = ranks_of_groups(groups, workloads, dp)
        for name, partitions in (("verl rows", verl), ("groups", ours)):
            row = {"dp": dp, "balancing": name, **measure(partitions, groups, prompt_lens, seq_lens, workloads)}
            results.append(row)
            print(f"{dp:>3} | {name:<10} | {row['groups_spread']:>13} | {row['token_frac']:>10.3f} | {row['imbalance']:>9.3f}")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"args": vars(args), "results": results}, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
