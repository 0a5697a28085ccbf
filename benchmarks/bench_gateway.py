"""The team-program gateway: what it adds to a model call, and how many calls it carries at once.

Latency: one program (a process of its own, the ``openai`` client) makes ``--calls`` sequential
calls through the gateway to a stand-in model that answers at once; each call's round trip is timed
in the program. The baseline is the same call handed to the run's handler directly, in-process
(what the agent loop does for an environment's turn). Their difference is the gateway's added
latency per call (p50, p99): HTTP, JSON, the request checks and the client library.

Throughput: ``--episodes`` program runs at once (one process each, ``--calls-per-episode`` calls
each) against one gateway and the same stand-in model: calls per second and the wall time, which
includes starting the program processes.

The gateway's share of a training step: give ``--metrics`` a ``main_ppo`` metrics JSONL of a
program recipe; each step's calls (``mas/program/calls``) times the added p50 latency, over the
step's time (``timing_s/step``).

    .venv/bin/python benchmarks/bench_gateway.py [--calls 500] [--episodes 256] [--metrics FILE] [--out benchmarks/results/gateway.json]
"""

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import tempfile
import time

from pettingllms_verl.config import ProgramConfig
from pettingllms_verl.programs.episode import Reply, Run, play_program
from pettingllms_verl.programs.gateway import Gateway, parse_request

AGENTS = ("agent",)
HERE = os.path.abspath(__file__)


async def timed_calls(task, client):
    """The benchmark's program: sequential calls, each timed; the times go to a file."""
    ai = client.openai()
    times = []
    for i in range(task["task"]["calls"]):
        start = time.perf_counter()
        await ai.chat.completions.create(model="agent", messages=[{"role": "user", "content": f"call {i}"}])
        times.append(time.perf_counter() - start)
    if task["task"].get("out"):
        with open(task["task"]["out"], "w") as f:
            json.dump(times, f)
    return 1.0


def render(agent, messages, tools=None) -> list[int]:
    return [len(m["content"]) for m in messages]


async def model(request, n, prompt_ids) -> Reply:
    return Reply([1, 2, 3], [-0.1] * 3, {"role": "assistant", "content": "ok"}, "stop")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def latency(calls: int) -> dict:
    door = Gateway()
    await door.start()
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "times.json")
        config = ProgramConfig(target=f"{HERE}:timed_calls", max_calls=calls + 1)
        await play_program(config, {"env": "bench", "seed": 0, "task": {"calls": calls, "out": out}}, AGENTS, 1, 1.0, door, render, model)
        through = json.load(open(out))[10:]  # the first calls warm the client's connection
    run = Run(AGENTS, calls + 1, render, model)
    direct = []
    for i in range(calls):
        start = time.perf_counter()
        await run(parse_request({"model": "agent", "messages": [{"role": "user", "content": f"call {i}"}]}, AGENTS))
        direct.append(time.perf_counter() - start)
    await door.stop()
    stats = {}
    for name, times in (("gateway", through), ("direct", direct)):
        stats[name] = {"p50_ms": 1000 * statistics.median(times), "p99_ms": 1000 * percentile(times, 0.99)}
    stats["added"] = {key: stats["gateway"][key] - stats["direct"][key] for key in ("p50_ms", "p99_ms")}
    return stats


async def throughput(episodes: int, calls: int) -> dict:
    door = Gateway()
    await door.start()
    # all of them alive at once (a rollout worker lets program.max_parallel_runs, 64 by default, run together)
    config = ProgramConfig(target=f"{HERE}:timed_calls", time_limit_s=1800, max_calls=calls + 1, max_parallel_runs=episodes)
    start = time.perf_counter()
    played = await asyncio.gather(*(
        play_program(config, {"env": "bench", "seed": i, "task": {"calls": calls}}, AGENTS, 1, 1.0, door, render, model) for i in range(episodes)
    ))
    wall = time.perf_counter() - start
    await door.stop()
    failed = sum(e.end_cause is not None for e in played)
    return {"episodes": episodes, "calls_per_episode": calls, "wall_s": wall, "calls_per_s": episodes * calls / wall,
            "episodes_per_s": episodes / wall, "failed": failed}


def step_share(path: str, added_p50_ms: float) -> list[dict]:
    rows = []
    for line in open(path):
        data = json.loads(line)["data"]
        if "mas/program/calls" in data and "timing_s/step" in data:
            seconds = data["mas/program/calls"] * added_p50_ms / 1000
            rows.append({"calls": data["mas/program/calls"], "step_s": data["timing_s/step"], "gateway_s": seconds,
                         "share": seconds / data["timing_s/step"]})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=500, help="sequential calls of the latency program")
    parser.add_argument("--episodes", type=int, default=256, help="program runs at once in the throughput test")
    parser.add_argument("--calls-per-episode", type=int, default=4)
    parser.add_argument("--metrics", help="a main_ppo metrics JSONL of a program recipe: the gateway's share of each step")
    parser.add_argument("--out", default="benchmarks/results/gateway.json")
    args = parser.parse_args()

    result = {"machine": platform.platform(), "cores": os.cpu_count(), "commit": subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=os.path.dirname(HERE)).stdout.strip()}
    result["latency"] = asyncio.run(latency(args.calls))
    print("| path | p50 ms | p99 ms |\n|---|---|---|")
    for name in ("direct", "gateway", "added"):
        print(f"| {name} | {result['latency'][name]['p50_ms']:.3f} | {result['latency'][name]['p99_ms']:.3f} |")
    result["throughput"] = asyncio.run(throughput(args.episodes, args.calls_per_episode))
    t = result["throughput"]
    print(f"\n{t['episodes']} episodes at once, {t['calls_per_episode']} calls each: {t['wall_s']:.1f} s, "
          f"{t['calls_per_s']:.1f} calls/s, {t['episodes_per_s']:.2f} episodes/s, {t['failed']} failed")
    if args.metrics:
        result["step_share"] = step_share(args.metrics, result["latency"]["added"]["p50_ms"])
        for row in result["step_share"]:
            print(f"step: {row['calls']:.0f} calls x {result['latency']['added']['p50_ms']:.2f} ms = {row['gateway_s']:.2f} s "
                  f"of {row['step_s']:.1f} s ({100 * row['share']:.2f} %)")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
