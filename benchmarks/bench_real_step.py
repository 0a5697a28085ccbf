"""The real model's training step: a LoRA adapter per role (the recipe) against full fine-tuning
without sharing (the baseline), side by side on one machine.

Runs Plan-Path 6x6 MAS AT-GRPO through ``python -m verl.trainer.main_ppo`` on SmolLM2-135M-Instruct
(``make real-model`` converts it into ``artifacts/smollm2_135m``; ``$PETTINGLLMS_ARTIFACTS`` names another folder), one run after another on
the same problems (2 problems x K = 4 x 2 roles x <= 2 turns per step):
- ``baseline``: ``plan_path_mas_atgrpo_cpu`` with the model path set to SmolLM2 and
  ``actor_rollout_ref.actor.use_prefix_grouper=false`` (full fine-tuning, every row's prompt whole);
- ``recipe``: ``plan_path_mas_lora_smollm2_cpu`` as shipped;
- ``recipe, adapters unfolded``: the recipe with the rollout serving each adapter as peft's active
  adapter (``engine_kwargs.hf.merge_adapters=false``), what it did before adapters were folded;
- ``one_thread``: the recipe with the rollout server and the trainer's workers on one thread each
  (``engine_kwargs.hf.torch_threads`` and the workers' ``OMP_NUM_THREADS``), as the tiny recipes and
  the baseline run; the recipe gives each both cores (``base/cpu_one_run``);
- ``baseline_threads``: the baseline with each side on as many threads as the recipe gives them
  (``base/cpu_one_run``). A synchronous step generates, then updates: the two never compute at once.
  Ratios are given against ``baseline`` and, where it ran, ``baseline_threads``: each only against the
  baseline whose sides run on as many threads as its own (``SIDE_THREADS``; the table says which), since
  a ratio between unequal thread settings credits a setting with the cores it was given.
  ``--unequal-threads`` gives every ratio, marked so.

No checkpoints, no validation. The figure is the second step's ``timing_s/*`` (the first warms up)
and its ratio to the baseline's. Each run samples its own replies, so the steps compared differ in
length; the step's time per token (``perf/total_num_tokens``, prompts and replies) depends less on
what a step drew (generation does not scale with it). Run it with nothing else on the machine.

``--repeats N`` runs the settings N times, interleaved (baseline, recipe, ..., baseline, recipe, ...),
so that a drift of the machine reaches every setting alike; each ratio is taken within a repeat and
reported as its mean over the repeats with a 95 % t interval (N - 1 degrees of freedom).

    python benchmarks/bench_real_step.py [--runs baseline,recipe,unfolded,one_thread,baseline_threads] [--repeats N]
        [--unequal-threads] [--out benchmarks/results/real_step.json]
    python benchmarks/bench_real_step.py --logs DIR   # the table again from a run's logs (DIR/<run>[_<repeat>].jsonl)
"""

import argparse
import json
import os
import sys
import tempfile
import time

from pettingllms_verl.backends.cpu import usable_cores

from training_run import THREADS, train

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMON = ["trainer.save_freq=-1", "trainer.test_freq=-1", "trainer.val_before_train=false", "trainer.resume_mode=disable"]
RUNS = {  # name -> (label, recipe, steps, overrides)
    "baseline": ("baseline: full fine-tuning, no shared prefix", "plan_path_mas_atgrpo_cpu", 2,
                 ["actor_rollout_ref.model.path={model}", "actor_rollout_ref.actor.use_prefix_grouper=false"]),
    "recipe": ("plan_path_mas_lora_smollm2_cpu", "plan_path_mas_lora_smollm2_cpu", 3, []),
    "unfolded": ("the recipe, adapters unfolded in the rollout", "plan_path_mas_lora_smollm2_cpu", 3,
                 ["++actor_rollout_ref.rollout.engine_kwargs.hf.merge_adapters=false"]),
    "one_thread": ("the recipe, rollout and trainer on one thread each", "plan_path_mas_lora_smollm2_cpu", 3, ["{one_thread}"]),
    "baseline_threads": ("baseline, rollout and trainer on every core", "plan_path_mas_atgrpo_cpu", 2,
                         ["actor_rollout_ref.model.path={model}", "actor_rollout_ref.actor.use_prefix_grouper=false", "{threads}"]),
}
# the threads each side (rollout server, trainer workers) runs on: 1, or the recipe's (base/cpu_one_run)
SIDE_THREADS = {"baseline": "1 thread", "recipe": "the recipe's threads", "unfolded": "the recipe's threads", "one_thread": "1 thread",
                "baseline_threads": "the recipe's threads"}
PARTS = ("step", "gen", "old_log_prob", "update_actor", "update_weights")  # timing_s/<part>
TIMED_STEP = 2


def prepare(root: str) -> None:
    """The real model (linked from the artifacts) and the Plan-Path 6x6 splits under ``root``."""
    from pettingllms_verl.data.rows import write_parquet
    from pettingllms_verl.envs.splits import generate_splits
    from pettingllms_verl.models import smollm2

    model = os.path.join(smollm2.artifacts_dir(), smollm2.FOLDER)
    if not os.path.isfile(os.path.join(model, "config.json")):
        sys.exit(f"{model}: the real model is not converted; run `make real-model` (or set PETTINGLLMS_ARTIFACTS to the folder that holds it)")
    os.symlink(model, os.path.join(root, smollm2.FOLDER))  # where the recipe's model path points
    for split, rows in generate_splits("plan_path", {"train": 64, "val": 4, "test": 4}, {"size": 6}, log=lambda _: None).items():
        write_parquet(rows, os.path.join(root, "data", "plan_path_6x6", f"{split}.parquet"))


def log_name(name: str, repeat: int, repeats: int) -> str:
    """A run's file log: ``<run>.jsonl``, or ``<run>_<repeat>.jsonl`` when the settings are repeated."""
    return f"{name}.jsonl" if repeats == 1 else f"{name}_{repeat}.jsonl"


def run(root: str, name: str, log: str) -> dict:
    """One run through main_ppo, logged to ``root/log``; its timed step's ``timing_s/*``."""
    from omegaconf import OmegaConf

    from pettingllms_verl.models import smollm2

    _, recipe, steps, overrides = RUNS[name]
    log = os.path.join(root, log)
    recipe_threads = OmegaConf.load(os.path.join(REPO, "recipes", "base", "cpu_one_run.yaml")).actor_rollout_ref.rollout.engine_kwargs.hf.torch_threads
    threads = {"{threads}": recipe_threads, "{one_thread}": 1}
    overrides = [expanded for override in overrides
                 for expanded in ([t.format(n=threads[override]) for t in THREADS] if override in threads
                                  else [override.format(model=os.path.join(root, smollm2.FOLDER))])]
    train(name, recipe, [f"trainer.total_training_steps={steps}", *COMMON, *overrides], root=root, log=log,
          env={**os.environ, "PETTINGLLMS_ARTIFACTS": root})
    return figures(log)


def figures(log: str) -> dict:
    """A run's timed step from its file log: ``timing_s/*``, tokens, and every step's time and time per token."""
    with open(log) as f:
        steps_logged = {record["step"]: record["data"] for record in map(json.loads, f)}
    timed = steps_logged[TIMED_STEP]
    per_token = {step: 1000 * data["timing_s/step"] / data["perf/total_num_tokens"] for step, data in steps_logged.items()}
    return {f"{part}_s": timed.get(f"timing_s/{part}", 0.0) for part in PARTS} | {
        "tokens": timed["perf/total_num_tokens"],
        "ms_per_token": per_token[TIMED_STEP],
        "steps_s": [steps_logged[step]["timing_s/step"] for step in sorted(steps_logged)],
        "steps_ms_per_token": [per_token[step] for step in sorted(steps_logged)],
        "token_frac": timed.get("actor/shared_prefix/token_frac"),
    }


BASELINES = ("baseline", "baseline_threads")


def ratio_keys(names: list[str]) -> list[str]:
    """The ratio columns: step time and time per token against each baseline that ran."""
    return [f"{what}_vs_{base}" for base in BASELINES if base in names for what in ("step", "per_token")]


def equal_baseline(names: list[str]) -> list[str]:
    """The settings of ``names`` with no baseline among them on equal threads (``SIDE_THREADS``)."""
    return [name for name in names if not any(SIDE_THREADS[base] == SIDE_THREADS[name] for base in BASELINES if base in names)]


def with_ratios(rows: list[dict], unequal: bool = False) -> None:
    """Each row's step time and time per token against each baseline's of the same repeat: None where it
    did not run, or (unless ``unequal``) where its sides run on other threads than the row's."""
    for base_name in BASELINES:
        baselines = {row["repeat"]: row for row in rows if row["run"] == base_name}
        for row in rows:
            base = baselines.get(row["repeat"]) if unequal or SIDE_THREADS[base_name] == SIDE_THREADS[row["run"]] else None
            row[f"step_vs_{base_name}"] = row["step_s"] / base["step_s"] if base else None
            row[f"per_token_vs_{base_name}"] = row["ms_per_token"] / base["ms_per_token"] if base else None


def summary(rows: list[dict], names: list[str]) -> list[dict]:
    """Per setting: each figure's mean over the repeats, and each ratio's mean with its t interval (None under two repeats)."""
    from pettingllms_verl.eval.stats import seed_interval

    out = []
    for name in names:
        runs = [row for row in rows if row["run"] == name]
        entry = {"run": name, "setting": RUNS[name][0], "repeats": len(runs)}
        entry |= {key: sum(row[key] for row in runs) / len(runs) for key in (*(f"{part}_s" for part in PARTS), "tokens", "ms_per_token")}
        for key in ratio_keys(names):
            ratios = [row[key] for row in runs if row[key] is not None]
            entry[key] = sum(ratios) / len(ratios) if ratios else None
            entry[f"{key}_interval"] = seed_interval(ratios)
        out.append(entry)
    return out


def ratio_text(value: float | None, interval: dict | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}x" + (f" [{interval['low']:.3f}, {interval['high']:.3f}]" if interval else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", default=",".join(RUNS), help=f"comma-separated, from: {', '.join(RUNS)} (ratios against baseline and, where it ran, "
                                                               "baseline_threads)")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each setting, interleaved; 2 or more: each ratio's 95 %% t interval over them")
    parser.add_argument("--out", default=os.path.join(REPO, "benchmarks", "results", "real_step.json"))
    parser.add_argument("--unequal-threads", action="store_true",
                        help="also give ratios against a baseline whose sides run on other threads than the setting's (marked: they credit the setting with "
                             "its cores)")
    parser.add_argument("--logs", help="a folder with the runs' file logs (<run>.jsonl, or <run>_<repeat>.jsonl with --repeats): print and write the table "
                                       "from them, run nothing")
    args = parser.parse_args()
    names = args.runs.split(",")
    unknown = sorted(set(names) - set(RUNS))
    if unknown:
        sys.exit(f"--runs: unknown {unknown}; from: {list(RUNS)}")
    if args.repeats < 1:
        sys.exit(f"--repeats: {args.repeats}; at least 1")
    alone = [name for name in equal_baseline(names) if name not in BASELINES]
    if alone and not args.unequal_threads:
        sys.exit(f"--runs: {', '.join(alone)} would have no baseline on equal threads (each side on "
                 f"{', '.join(sorted({SIDE_THREADS[name] for name in alone}))}): add "
                 f"{' or '.join(base for base in BASELINES if SIDE_THREADS[base] in {SIDE_THREADS[n] for n in alone})} to --runs, "
                 "or give --unequal-threads to compare unequal settings (marked so)")
    order = [(repeat, name) for repeat in range(args.repeats) for name in names]  # interleaved
    if args.logs:
        missing = [log for log in (log_name(name, repeat, args.repeats) for repeat, name in order) if not os.path.isfile(os.path.join(args.logs, log))]
        if missing:
            sys.exit(f"--logs {args.logs}: no {', '.join(missing)} (the runs' logs are <run>.jsonl, or <run>_<repeat>.jsonl with --repeats)")
        rows = [{"run": name, "repeat": repeat, "setting": RUNS[name][0], **figures(os.path.join(args.logs, log_name(name, repeat, args.repeats)))}
                for repeat, name in order]
        taken = time.strftime("%Y-%m-%d", time.localtime(os.path.getmtime(os.path.join(args.logs, log_name(*order[0][::-1], args.repeats)))))
    else:
        root = tempfile.mkdtemp(prefix="bench_real_step_")
        prepare(root)
        rows = [{"run": name, "repeat": repeat, "setting": RUNS[name][0], **run(root, name, log_name(name, repeat, args.repeats))}
                for repeat, name in order]
        taken = time.strftime("%Y-%m-%d")
    with_ratios(rows, args.unequal_threads)
    print(f"\nsecond step's timing_s/* (s), runs of {taken}" + ("" if args.logs else f", {usable_cores()} usable cores")
          + "; each side on: " + ", ".join(f"{name} {SIDE_THREADS[name]}" for name in names)
          + ("; ratios between unequal thread settings included (--unequal-threads)" if args.unequal_threads else
             "; each ratio against the baseline on equal threads only"))
    ratios = ratio_keys(names)
    heads = {key: key.replace("per_token", "tok").replace("_vs_", "/").replace("baseline", "base") for key in ratios}
    print(f"{'setting':<46} {'rep':>3} {'step':>6} {'gen':>6} {'old lp':>6} {'update':>6} {'sync':>5} {'tokens':>6} {'ms/tok':>6} "
          + " ".join(f"{heads[key]:>21}" for key in ratios))
    for row in rows:
        print(f"{row['setting']:<46} {row['repeat']:>3} {row['step_s']:>6.1f} {row['gen_s']:>6.1f} {row['old_log_prob_s']:>6.2f} {row['update_actor_s']:>6.1f} "
              f"{row['update_weights_s']:>5.2f} {row['tokens']:>6} {row['ms_per_token']:>6.2f} "
              + " ".join(f"{ratio_text(row[key], None):>21}" for key in ratios))
    settings = summary(rows, names)
    if args.repeats > 1:
        print(f"\nmean over {args.repeats} repeats, ratios within a repeat with their 95 % t interval over the repeats")
        print(f"{'setting':<46} {'step':>6} {'gen':>6} {'update':>6} " + " ".join(f"{heads[key]:>26}" for key in ratios))
        for entry in settings:
            print(f"{entry['setting']:<46} {entry['step_s']:>6.1f} {entry['gen_s']:>6.1f} {entry['update_actor_s']:>6.1f} "
                  + " ".join(f"{ratio_text(entry[key], entry[f'{key}_interval']):>26}" for key in ratios))
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"runs": rows, "settings": settings, "side_threads": {name: SIDE_THREADS[name] for name in names},
                   "unequal_threads": args.unequal_threads}, f, indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
