"""AT-GRPO grouping + advantage vs verl's grpo_vectorized on the same data.

1M samples in groups of 8 with string keys "uid|turn|role|node"; response_length is small so
the timing is dominated by grouping. Two row orders: "contiguous" (a group's samples adjacent,
as the tree sampler emits them) and "shuffled" (worst case for memory locality). Best of N.

    .venv/bin/python benchmarks/bench_at_grpo.py [--samples 1000000] [--out benchmarks/results/at_grpo.json]
"""

import argparse
import json
import os
import platform
import time

import numpy as np
import torch
from verl.trainer.ppo.core_algos import AdvantageEstimator, get_adv_estimator_fn

from pettingllms_verl.algo import compute_at_grpo_advantage, group_ids

ROLES = ("plan", "tool")


def make_keys(num_samples: int, group_size: int) -> np.ndarray:
    # group g = (problem, turn, role, node); rows of a group are adjacent
    g = np.arange(num_samples) // group_size
    role_turn_node = 2 * len(ROLES) * 2
    return np.array(
        [
            f"uid{p}|t{(r // 4) % 2}|{ROLES[(r // 2) % 2]}|n{r % 2}"
            for p, r in zip((g // role_turn_node).tolist(), (g % role_turn_node).tolist())
        ],
        dtype=object,
    )


def best_of(fn, repeats: int) -> tuple[float, list[float]]:
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - start)
    return min(runs), runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=1_000_000)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--response-length", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    parser.add_argument("--out", default="benchmarks/results/at_grpo.json")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    gen = torch.Generator().manual_seed(0)
    # reward on the last token only, 0/1 like a success reward: many zero-variance groups
    rewards = torch.zeros(args.samples, args.response_length)
    rewards[:, -1] = torch.randint(0, 2, (args.samples,), generator=gen).float()
    mask = torch.ones_like(rewards)
    keys = make_keys(args.samples, args.group_size)
    num_groups = int(group_ids(keys).max()) + 1
    grpo_vectorized = get_adv_estimator_fn(AdvantageEstimator.GRPO_VECTORIZED)

    results = []
    for order in ("contiguous", "shuffled"):
        perm = torch.randperm(args.samples, generator=gen) if order == "shuffled" else torch.arange(args.samples)
        # the key objects stay where they were created, as when verl's balance_batch reorders rows
        k = keys[perm.numpy()]
        r, m = rewards[perm], mask[perm]
        cases = {
            "at_grpo group_ids": lambda: group_ids(k),
            "at_grpo group_ids + advantage": lambda: compute_at_grpo_advantage(r, m, k),
            "verl grpo_vectorized": lambda: grpo_vectorized(token_level_rewards=r, response_mask=m, index=k),
        }
        for name, fn in cases.items():
            best, runs = best_of(fn, args.repeats)
            results.append({"order": order, "impl": name, "best_s": best, "runs_s": runs})
        # both normalise by the unbiased group std; they may differ only where a group is
        # constant (verl can leave a rounding residue / eps there), so compare the other rows
        ours, _ = compute_at_grpo_advantage(r, m, k)
        theirs, _ = grpo_vectorized(token_level_rewards=r, response_mask=m, index=k)
        informative = ours[:, -1] != 0
        diff = float((ours - theirs)[informative].abs().max())
        results[-1]["max_abs_diff_on_informative_rows"] = diff
        print(f"{order}: max |ours - verl| on rows of non-constant groups = {diff:.2e}")

    report = {
        "samples": args.samples,
        "groups": num_groups,
        "group_size": args.group_size,
        "response_length": args.response_length,
        "repeats": args.repeats,
        "torch_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "machine": platform.processor() or platform.machine(),
        "results": results,
    }
    print(f"{args.samples} samples, {num_groups} groups of {args.group_size}, best of {args.repeats}")
    print(f"{'order':<11} {'impl':<31} {'best s':>8}")
    for row in results:
        print(f"{row['order']:<11} {row['impl']:<31} {row['best_s']:>8.3f}")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
