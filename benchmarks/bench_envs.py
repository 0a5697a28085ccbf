"""Environment speed: µs per step, ms to clone one tree node K times, generated tasks per second.

``python benchmarks/bench_envs.py [--out benchmarks/results/envs.json] [--envs plan_path sudoku]``

Each measurement is the best of ``--repeats`` runs (the machine may be shared). Reset is
``env.reset(seed, task)`` from a given task, as a training episode starts. A step is one reply
of the first role of the env's ``sa`` workflow, taken on a fresh clone of a reset env. Generation
times ``env.reset(seed)`` over new seeds, which includes each env's own verification (Sokoban: BFS
solver; Sudoku: uniqueness), so it is the verified-task rate.
"""

from __future__ import annotations

import argparse
import json
import os
import time

from pettingllms_verl.envs import make

# env name -> a typical short reply of its stepping role; add an entry to benchmark another env.
SAMPLE_REPLIES = {
    "plan_path": "<answer>R</answer>",
    "sokoban": "<answer>R</answer>",
    "sudoku": "<answer>[0, 1, 2]</answer>",
    "tictactoe": "<answer>4</answer>",
    "hanabi": "<answer>play 0</answer>",
}


def best_of(repeats: int, run) -> float:
    return min(run() for _ in range(repeats))


def step_us(name: str, reply: str, steps: int, repeats: int) -> float:
    base = make(name)
    base.reset(0)
    role = base.workflow("sa").turn_order[0]

    def run() -> float:
        clones = [base.clone() for _ in range(steps)]
        start = time.perf_counter()
        for env in clones:
            env.step(role, reply)
        return (time.perf_counter() - start) / steps * 1e6

    return best_of(repeats, run)


def clone_ms(name: str, k: int, nodes: int, repeats: int) -> float:
    base = make(name)
    base.reset(0)

    def run() -> float:
        start = time.perf_counter()
        for _ in range(nodes):
            [base.clone() for _ in range(k)]
        return (time.perf_counter() - start) / nodes * 1e3

    return best_of(repeats, run)


def reset_us(name: str, resets: int, repeats: int) -> float:
    """µs per ``reset(seed, task)`` from a given task: what a training episode does (its task comes
    from the dataset, not generated)."""
    env = make(name)
    env.reset(0)
    task = env.task

    def run() -> float:
        start = time.perf_counter()
        for seed in range(resets):
            env.reset(seed, task)
        return (time.perf_counter() - start) / resets * 1e6

    return best_of(repeats, run)


def tasks_per_s(name: str, seconds: float, repeats: int) -> float:
    env = make(name)
    env.reset(0)  # warm caches (e.g. Sudoku's grid table) outside the timing
    seeds = iter(range(1, 10**9))

    def run() -> float:
        count, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            env.reset(next(seeds))
            count += 1
        return -count / (time.perf_counter() - start)  # negated: best_of keeps the minimum

    return -best_of(repeats, run)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=os.path.join("benchmarks", "results", "envs.json"))
    parser.add_argument("--envs", nargs="*", default=list(SAMPLE_REPLIES))
    parser.add_argument("--steps", type=int, default=20_000, help="steps timed per repeat")
    parser.add_argument("--k", type=int, default=8, help="clones per tree node")
    parser.add_argument("--seconds", type=float, default=1.0, help="generation time per repeat")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)

    results = {}
    print(f"{'env':<12}{'step µs':>10}{f'clone K={args.k} ms':>16}{'reset µs':>10}{'tasks/s':>12}")
    for name in args.envs:
        results[name] = {
            "step_us": step_us(name, SAMPLE_REPLIES[name], args.steps, args.repeats),
            f"clone_k{args.k}_ms": clone_ms(name, args.k, 2_000, args.repeats),
            "reset_from_task_us": reset_us(name, 2_000, args.repeats),
            "generated_tasks_per_s": tasks_per_s(name, args.seconds, args.repeats),
        }
        row = results[name]
        print(f"{name:<12}{row['step_us']:>10.2f}{row[f'clone_k{args.k}_ms']:>16.4f}{row['reset_from_task_us']:>10.2f}{row['generated_tasks_per_s']:>12.0f}")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"cpu_count": os.cpu_count(), "load_avg_1m": os.getloadavg()[0], "envs": results}, f, indent=2)
    print(f"wrote {args.out}")
    return results


if __name__ == "__main__":
    main()
