"""Sandbox throughput: executions/s of a trivial program, every limit in force.

Compares run_python with 1 and 2 concurrent callers against a bare `python -c` spawn per
execution (no limits at all). Prints a table and writes JSON.

    .venv/bin/python benchmarks/bench_sandbox.py [--seconds 3] [--out benchmarks/results/sandbox.json]
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import threading
import time
from dataclasses import asdict

from pettingllms_verl.sandbox import SandboxLimits, run_python
from pettingllms_verl.sandbox import client

TRIVIAL_PROGRAM = "print(1)"


def sandbox_rate(callers: int, seconds: float, limits: SandboxLimits) -> float:
    counts = [0] * callers
    failures: list[str] = []
    stop_at = time.monotonic() + seconds

    def caller(index: int) -> None:
        while time.monotonic() < stop_at:
            res = run_python(TRIVIAL_PROGRAM, limits=limits)
            if res.stdout != "1\n":
                failures.append(f"{res.status}: {res.stderr[-200:]}")
                return
            counts[index] += 1

    start = time.monotonic()
    threads = [threading.Thread(target=caller, args=(i,)) for i in range(callers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise RuntimeError(f"sandbox run failed: {failures[0]}")
    return sum(counts) / (time.monotonic() - start)


def bare_spawn_rate(seconds: float) -> float:
    count = 0
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        subprocess.run([sys.executable, "-c", TRIVIAL_PROGRAM], capture_output=True, check=True)
        count += 1
    return count / (time.monotonic() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="measuring time per row")
    parser.add_argument("--out", default="benchmarks/results/sandbox.json", help="JSON output path")
    args = parser.parse_args()

    limits = SandboxLimits()
    run_python(TRIVIAL_PROGRAM)  # start the fork server outside the measurement
    rows = [
        ("sandbox run_python, 1 caller", 1, sandbox_rate(1, args.seconds, limits)),
        ("sandbox run_python, 2 callers", 2, sandbox_rate(2, args.seconds, limits)),
        ("bare subprocess python -c, 1 caller", 1, bare_spawn_rate(args.seconds)),
    ]
    load = os.getloadavg()

    print(f"{'mode':<40}{'callers':>8}{'exec/s':>10}")
    for name, callers, rate in rows:
        print(f"{name:<40}{callers:>8}{rate:>10.1f}")
    print(f"cpus={os.cpu_count()} loadavg(1m)={load[0]:.2f} isolation={client.isolation()}")

    report = {
        "program": TRIVIAL_PROGRAM,
        "limits": asdict(limits),
        "isolation": client.isolation(),
        "seconds_per_row": args.seconds,
        "results": [
            {"mode": name, "callers": callers, "executions_per_s": round(rate, 1)} for name, callers, rate in rows
        ],
        "machine": {
            "cpus": os.cpu_count(),
            "loadavg_1m_after": round(load[0], 2),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as out:
        json.dump(report, out, indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
