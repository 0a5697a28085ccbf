"""Evaluation throughput: episodes per second of ``pettingllms-eval`` with the ``hf`` engine, one
episode at a time (``data.val_batch_size=1``: verl's validation waits for each batch) vs all the
episodes batched (their requests share the replica's ``generate`` calls).

    python benchmarks/bench_eval.py [--recipe plan_path_mas_lora_smollm2_cpu] [--episodes 32] [--single-episodes 8]

Episodes per second are taken while playing (first episode start to last episode end, from the
episode logs); start-up (Ray, workers, model load) is reported apart. Prints a table and writes JSON.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def evaluate(recipe: str, episodes: int, batch: int, out: str) -> dict:
    command = [sys.executable, "-m", "pettingllms_verl.eval", recipe, "--episodes", str(episodes), "--swap", "none",
               "--set", f"data.val_batch_size={batch}", "--out", out]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    (row,) = json.load(open(os.path.join(out, "results.json")))["rows"]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="plan_path_mas_lora_smollm2_cpu", help="the recipe evaluated (base models)")
    parser.add_argument("--episodes", type=int, default=32, help="test problems played batched")
    parser.add_argument("--single-episodes", type=int, default=8, help="test problems played one at a time (a rate: fewer suffice)")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "eval.json"))
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for mode, episodes, batch in (("one at a time", args.single_episodes, 1), ("batched", args.episodes, args.episodes)):
            row = evaluate(args.recipe, episodes, batch, os.path.join(tmp, str(batch)))
            rows.append({"mode": mode, "val_batch_size": batch, "episodes": row["episodes"], "episodes_per_s": row["episodes_per_s"],
                         "wall_s": row["wall_s"], "success": row["success"]})
    speedup = rows[1]["episodes_per_s"] / rows[0]["episodes_per_s"]
    print(f"{args.recipe}, load average {os.getloadavg()[0]:.1f}")
    print(f"{'mode':<14} {'episodes':>8} {'episodes/s':>10} {'run wall s':>10} {'success':>8}")
    for row in rows:
        print(f"{row['mode']:<14} {row['episodes']:>8} {row['episodes_per_s']:>10.3f} {row['wall_s']:>10.0f} {row['success']:>8.3f}")
    print(f"batched / one at a time: {speedup:.1f}x")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"recipe": args.recipe, "load_average": os.getloadavg()[0], "speedup": speedup, "rows": rows}, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
