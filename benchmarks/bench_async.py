"""Synchronous against asynchronous training of a team (mas_sync, mas_colocate_async, mas_separate_async), on one machine.

Every trainer runs through ``python -m verl.trainer.main_ppo``, one run after another.

Every setting runs the reproduction's method with a model per role (``plan_path_mas_full_repro_cpu``:
Plan-Path 4x4, a K = 4 tree, 4 problems per step, two policies). ``mas_sync`` and
``mas_colocate_async`` give the rollout server and the trainer's workers each every core
(``base/cpu_one_run``: neither computes on both sides at once, so each phase gets the machine);
``mas_separate_async`` gives each side one thread (each policy's rollout on a pool of its own,
computing while its trainer trains; weights pushed over gloo after every step), on two workloads:
- ``repro``: the reproduction as shipped (one turn per episode);
- ``long_tail``: the same team on Plan-Path 6x6 (larger grids than its warm start saw) with up to
  ``LONG_TAIL_TURNS`` turns, an episode ending when the route is right: episodes of 1 to 8 turns in
  one step (on 4x4 nearly every episode ends in one turn; a hotter planner made every one run all 8).

Each run trains ``STEPS`` steps from the warm start (no checkpoints, no validation); the first
``WARMUP`` are left out of the figures. Per run: rows trained per second of step time, steps per
hour, the share of step time the trainer waits for rows (``timing_s/gen`` / ``timing_s/step``) and
the share the rollout is paused while the policies train (the rest: with the colocated schedules
the rollout generates only while the trainer waits; on pools of its own it pauses only while its
weights arrive), verl's staleness of the rows trained, the mean over steps of a step's longest
episode (turns), and ("apart", colocated schedules) the speed-up a rollout and a trainer on devices
of their own would give at best: a step taking the longer of the two phases instead of their sum.

``--repeats N`` interleaves the runs (sync, colocate, separate, sync, ...); each ratio is taken within a repeat
and reported as its mean with a 95 % t interval over the repeats. Needs the reproduction's data and
warm start (``make data-plan_path_4x4_short data-plan_path_6x6 model-plan-path-demos``; ``$PETTINGLLMS_ARTIFACTS`` names
another folder). Run it with nothing else on the machine.

    python benchmarks/bench_async.py [--workloads repro,long_tail] [--settings sync,colocate,separate] [--repeats N] [--out benchmarks/results/async.json]
    python benchmarks/bench_async.py --logs DIR   # the table again from a run's logs (DIR/<workload>_<setting>_<repeat>.jsonl)
"""

import argparse
import json
import os
import sys
import tempfile

from pettingllms_verl.backends.cpu import usable_cores

from training_run import THREADS, train

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECIPE = "plan_path_mas_full_repro_cpu"
STEPS, WARMUP = 8, 2
LONG_TAIL_TURNS = 8
LONG_TAIL_DATA = "${pettingllms.paths.artifacts}/data/plan_path_6x6"  # make data-plan_path_6x6
COMMON = [f"trainer.total_training_steps={STEPS}", "trainer.save_freq=-1", "trainer.test_freq=-1", "trainer.val_before_train=false",
          "trainer.resume_mode=disable"]
SETTINGS = {  # name -> (label, overrides)
    "sync": ("mas_sync", ["trainer.v1.trainer_mode=mas_sync"]),
    "colocate": ("mas_colocate_async", ["trainer.v1.trainer_mode=mas_colocate_async"]),
    # one thread each side (given after THREADS, which these override), one Ray slot per policy's rollout pool
    "separate": ("mas_separate_async", ["trainer.v1.trainer_mode=mas_separate_async", "actor_rollout_ref.hybrid_engine=false",
                                        "actor_rollout_ref.rollout.nnodes=1", "actor_rollout_ref.rollout.n_gpus_per_node=1",
                                        "actor_rollout_ref.rollout.checkpoint_engine.backend=gloo", "ray_kwargs.ray_init.num_gpus=3",
                                        "trainer.v1.separate_async.parameter_sync_step=1",
                                        "++actor_rollout_ref.rollout.engine_kwargs.hf.torch_threads=1",
                                        '++ray_kwargs.ray_init.runtime_env.env_vars.OMP_NUM_THREADS="1"']),
}
WORKLOADS = {  # name -> (label, overrides)
    "repro": ("the reproduction (1 turn)", []),
    "long_tail": (f"6x6, up to {LONG_TAIL_TURNS} turns",
                  [f"pettingllms.env_kwargs.max_turns={LONG_TAIL_TURNS}", f"data.train_files={LONG_TAIL_DATA}/train.parquet",
                   f"data.val_files={LONG_TAIL_DATA}/val.parquet"]),
}


def log_name(workload: str, setting: str, repeat: int) -> str:
    return f"{workload}_{setting}_{repeat}.jsonl"


def run(root: str, workload: str, setting: str, log: str) -> dict:
    """One run through main_ppo, logged to ``root/log``; its figures."""
    log = os.path.join(root, log)
    overrides = [*COMMON, *(t.format(n=usable_cores()) for t in THREADS), *WORKLOADS[workload][1], *SETTINGS[setting][1],
                 f"trainer.default_local_dir={root}/checkpoints"]
    artifacts = os.path.abspath(os.environ.get("PETTINGLLMS_ARTIFACTS") or os.path.join(REPO, "artifacts"))
    train(f"{workload} {setting}", RECIPE, overrides, root=root, log=log, env={**os.environ, "PETTINGLLMS_ARTIFACTS": artifacts})
    return figures(log, setting)


def figures(log: str, setting: str) -> dict:
    """A run's figures over its steps after ``WARMUP``, from its file log (``setting``: its trainer's key in SETTINGS)."""
    with open(log) as f:
        steps = [record["data"] for record in map(json.loads, f) if record["step"] > WARMUP]
    step_s = sum(data["timing_s/step"] for data in steps)
    gen_s = sum(data["timing_s/gen"] for data in steps)
    push_s = sum(data.get("timing_s/update_weights", 0.0) for data in steps)
    separate = setting == "separate"
    rows = sum(value for data in steps for key, value in data.items() if key.startswith("policy/") and key.endswith("/rows"))
    return {
        "steps": len(steps),
        "rows": rows,
        "rows_per_s": rows / step_s,
        "steps_per_hour": 3600 * len(steps) / step_s,
        "step_s": step_s / len(steps),
        "trainer_waits": gen_s / step_s,  # the trainer idles while the rows it takes are played
        # the rollout idles while the policies train and push; on pools of its own, only while its weights arrive
        "rollout_paused": push_s / step_s if separate else 1 - gen_s / step_s,
        # with the rollout and the trainer on devices of their own (verl's separate_async), a step would
        # take the longer of the two phases instead of their sum: the speed-up that predicts, at best
        "separate_pools_bound": None if separate else step_s / max(gen_s, step_s - gen_s),
        "staleness_mean": sum(data["training/off_policy/trajectory_staleness/mean"] for data in steps) / len(steps),
        "staleness_max": max(data["training/off_policy/trajectory_staleness_worst/max"] for data in steps),
        "turns_mean": sum(data.get("mas/turns_mean", 0.0) for data in steps) / len(steps),
        "turns_max_mean": sum(data.get("mas/turns_max", 0.0) for data in steps) / len(steps),  # a step's longest episode
        "success": sum(data.get("mas/success", 0.0) for data in steps) / len(steps),
    }


def main() -> None:
    from pettingllms_verl.eval.stats import seed_interval

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help=f"comma-separated, from: {', '.join(WORKLOADS)}")
    parser.add_argument("--settings", default=",".join(SETTINGS), help=f"comma-separated, sync and any of: {', '.join(SETTINGS)}")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each setting, interleaved; 2 or more: each ratio's 95 %% t interval")
    parser.add_argument("--out", default=os.path.join(REPO, "benchmarks", "results", "async.json"))
    parser.add_argument("--logs", help="a folder with the runs' file logs (<workload>_<setting>_<repeat>.jsonl): the table from them, run nothing")
    args = parser.parse_args()
    workloads = args.workloads.split(",")
    unknown = sorted(set(workloads) - set(WORKLOADS))
    if unknown:
        sys.exit(f"--workloads: unknown {unknown}; from: {list(WORKLOADS)}")
    settings = args.settings.split(",")
    if "sync" not in settings or set(settings) - set(SETTINGS):
        sys.exit(f"--settings {args.settings}: sync and any of {list(SETTINGS)}")
    if args.repeats < 1:
        sys.exit(f"--repeats: {args.repeats}; at least 1")
    order = [(workload, repeat, setting) for workload in workloads for repeat in range(args.repeats) for setting in settings]
    if args.logs:
        missing = [name for name in (log_name(w, s, r) for w, r, s in order) if not os.path.isfile(os.path.join(args.logs, name))]
        if missing:
            sys.exit(f"--logs {args.logs}: no {', '.join(missing)}")
        runs = [{"workload": w, "setting": s, "repeat": r, **figures(os.path.join(args.logs, log_name(w, s, r)), s)} for w, r, s in order]
    else:
        root = tempfile.mkdtemp(prefix="bench_async_")
        runs = [{"workload": w, "setting": s, "repeat": r, **run(root, w, s, log_name(w, s, r))} for w, r, s in order]
    sync = {(row["workload"], row["repeat"]): row for row in runs if row["setting"] == "sync"}
    for row in runs:
        row["rows_per_s_vs_sync"] = row["rows_per_s"] / sync[(row["workload"], row["repeat"])]["rows_per_s"]
    print(f"\nsteps {WARMUP + 1}-{STEPS} of each run, {usable_cores()} usable cores, rollout and trainer each on every core "
          "(base/cpu_one_run; mas_separate_async: one thread each), one machine, runs interleaved")
    print(f"{'workload':<30} {'trainer':<19} {'rep':>3} {'rows/s':>7} {'steps/h':>7} {'step s':>6} {'waits':>6} {'paused':>6} "
          f"{'stale':>5} {'max':>3} {'turns':>5} {'longest':>7} {'vs sync':>8} {'apart':>6}")
    for row in runs:
        print(f"{WORKLOADS[row['workload']][0]:<30} {SETTINGS[row['setting']][0]:<19} {row['repeat']:>3} {row['rows_per_s']:>7.2f} "
              f"{row['steps_per_hour']:>7.0f} {row['step_s']:>6.1f} {row['trainer_waits']:>6.2f} {row['rollout_paused']:>6.2f} "
              f"{row['staleness_mean']:>5.2f} {row['staleness_max']:>3.0f} {row['turns_mean']:>5.2f} {row.get('turns_max_mean', 0.0):>7.2f} "
              f"{row['rows_per_s_vs_sync']:>7.2f}x "
              + (f"{row['separate_pools_bound']:>5.2f}x" if row["separate_pools_bound"] is not None else f"{'-':>6}"))
    summary = []
    for workload in workloads:
        for setting in (s for s in settings if s != "sync"):
            ratios = [row["rows_per_s_vs_sync"] for row in runs if row["workload"] == workload and row["setting"] == setting]
            entry = {"workload": workload, "setting": setting, "rows_per_s_vs_sync": sum(ratios) / len(ratios), "interval": seed_interval(ratios),
                     "repeats": len(ratios)}
            summary.append(entry)
            interval = entry["interval"]
            print(f"{WORKLOADS[workload][0]}: {SETTINGS[setting][0]} / mas_sync rows per second {entry['rows_per_s_vs_sync']:.2f}x"
                  + (f" [{interval['low']:.2f}, {interval['high']:.2f}]" if interval else "") + f" over {len(ratios)} repeat(s)")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"runs": runs, "summary": summary, "steps": STEPS, "warmup": WARMUP, "recipe": RECIPE, "cores": usable_cores()}, f, indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
