"""The cost of a second node: the L2 Plan-Path CPU recipe (a model per role, ``plan_policy`` on a
pool of its own) on a Ray cluster of one node holding both policies' trainer slots, and on two
nodes holding one each (so each policy's trainer rank, server and weight sync are on its own node,
and rows cross nodes), with the same number of episode workers.

Both clusters are started as `ray start` starts a real one, on this machine (``tests/support/cluster.py``:
a raylet per node, every node on 127.0.0.1, the same logical CPUs in all). Each setting runs
``--steps`` training steps through ``python -m verl.trainer.main_ppo`` at the recipe's batch and at
``--scale`` times its episodes. Step time is the mean ``timing_s/step`` of the steps after the
first; rollout rows/s is the rows of a step over its ``timing_s/gen``.

    python benchmarks/bench_cluster.py [--steps 3] [--scale 2] [--out benchmarks/results/cluster.json]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_policies import prepare  # noqa: E402  (the warm-started tiny model and Plan-Path 6x6 data)
from cluster import LocalCluster  # noqa: E402  (the test suite's cluster on this machine)

RECIPE = "plan_path_mas_full_cpu"
OWN_POOL = ["+pettingllms.policies.plan_policy.pool=own", "+pettingllms.policies.plan_policy.n_gpus_per_node=1"]
CLUSTERS = {  # name -> LocalCluster arguments: 2 trainer slots (Ray GPUs) and 16 CPUs in all
    "one node": {"names": ["a"], "gpus": 2, "cpus": 16},
    "two nodes": {"names": ["a", "b"], "gpus": 1, "cpus": 8},
}


def run(root: str, cluster: LocalCluster, model: str, steps: int, batch: int, workers: int) -> dict:
    log = os.path.join(root, f"cluster_{len(cluster.names)}_{batch}.jsonl")
    args = cluster.main_ppo_args(
        "--config-name", RECIPE, *OWN_POOL, f"trainer.total_training_steps={steps}", f"actor_rollout_ref.model.path={model}",
        f"data.train_batch_size={batch}", f"actor_rollout_ref.rollout.agent.num_workers={workers}",
        "trainer.save_freq=-1", "trainer.resume_mode=disable", f"trainer.experiment_name=bench_cluster_{len(cluster.names)}_{batch}",
        worker_env={"VERL_FILE_LOGGER_PATH": log},
    )
    env = cluster.env({**os.environ, "PETTINGLLMS_ARTIFACTS": root, "HF_HUB_OFFLINE": "1"})
    result = subprocess.run([sys.executable, "-m", "verl.trainer.main_ppo", *args], cwd=root, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"{RECIPE} on {cluster.names} failed:\n{result.stderr[-3000:]}")
    timed = [json.loads(line)["data"] for line in open(log)][1:]
    rows = [sum(v for k, v in step.items() if k.startswith("policy/") and k.endswith("/rows")) for step in timed]
    return {
        "step_s": sum(step["timing_s/step"] for step in timed) / len(timed),
        "rows_per_step": sum(rows) / len(rows),
        "rollout_rows_per_s": sum(rows) / sum(step["timing_s/gen"] for step in timed),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=3, help="training steps per run (the first is not timed)")
    parser.add_argument("--batch", type=int, default=2, help="problems per step at scale 1 (data.train_batch_size)")
    parser.add_argument("--scale", type=int, default=2, help="the larger run's episodes, as a multiple of --batch")
    parser.add_argument("--workers", type=int, default=2, help="episode workers (actor_rollout_ref.rollout.agent.num_workers)")
    parser.add_argument("--out", default=os.path.join(REPO, "benchmarks", "results", "cluster.json"))
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="bench_cluster_")
    model = prepare(root, ["tiny"])["tiny"]
    results = []
    print(f"{'cluster':<10} {'problems':>8} {'rows':>6} {'step s':>8} {'rollout rows/s':>15} {'step / one node':>16}", flush=True)
    one_node: dict[int, float] = {}
    for name, options in CLUSTERS.items():
        with LocalCluster(**options) as cluster:
            for batch in (args.batch, args.batch * args.scale):
                figures = {"cluster": name, "problems": batch, **run(root, cluster, model, args.steps, batch, args.workers)}
                one_node.setdefault(batch, figures["step_s"])
                figures["step_vs_one_node"] = figures["step_s"] / one_node[batch]
                results.append(figures)
                print(f"{name:<10} {batch:>8} {figures['rows_per_step']:>6.0f} {figures['step_s']:>8.2f} "
                      f"{figures['rollout_rows_per_s']:>15.2f} {figures['step_vs_one_node']:>15.2f}x", flush=True)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
