"""Reproduce "MAS + AT-GRPO beats SA + GRPO" on CPU: ``python -m pettingllms_verl.eval.reproduce`` (``make reproduce``).

Plan-Path 4x4 in one turn with routes of 2-3 moves, models warm-started by verl's SFT trainer on
noisy demonstrations, and methods with the same steps, replies per step and optimizer steps
(``recipes/base/repro_plan_path.yaml``), four of them on the tiny model:

- ``sa``: SA + GRPO (the plan agent alone, ``plan_path_sa_grpo_repro_cpu``);
- ``mas``: MAS + AT-GRPO, one policy shared by both roles (``plan_path_mas_atgrpo_repro_cpu``);
- ``mas_by_problem``: the same with each reply's group keyed by its problem alone, not by (problem,
  turn, agent, tree node) (``plan_path_mas_grpo_by_problem_repro_cpu``): the credit-assignment ablation;
- ``per_role``: MAS + AT-GRPO, a model per role (``plan_path_mas_full_repro_cpu``), also evaluated
  with the two trained policies swapped;
- ``real`` (not in the default ``--methods``; ``make reproduce-real``): the real model, SmolLM2-135M
  with a LoRA adapter per role, each warm-started on its role's demonstrations
  (``plan_path_mas_lora_smollm2_repro_cpu``), also evaluated swapped.

Each method trains once per seed through ``main_ppo`` (validating on the val split; a rerun resumes
a run cut short and skips a finished one; it refuses one saved from another warm start or with other
training settings), ``--jobs`` runs at once. ``pettingllms-eval`` then plays each method's
recipe at its warm start ("before") and each run's best step on val ("after") on the test split. ``--set`` can
start the roles of ``per_role`` apart, e.g. ``--methods per_role --set
++pettingllms.policies.plan_policy.overrides.model.path=DIR``. A training run that fails is reported
as failed (its seed is left out of the method's figures, and said so); the others go on. Writes to
--out: ``reproduce.md`` and ``reproduce.json`` (test success per method before and after training:
each seed's success and episodes, the success pooled over seeds with its binomial standard error, the
gain over the warm start in standard errors of the difference, and the comparisons between methods),
``reproduce.png`` (the same as bars), ``learning_curves.png``, the evaluations (``before/``,
``after/``), the training logs (``logs/``) and checkpoints (``checkpoints/``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
import warnings
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from omegaconf import OmegaConf

from pettingllms_verl.eval import __main__ as evaluate
from pettingllms_verl.eval import plots, runs
from pettingllms_verl.eval.results import binomial_se
from pettingllms_verl.files import write_whole

METHODS = {  # name -> (recipe, what the tables call it)
    "sa": ("plan_path_sa_grpo_repro_cpu", "SA + GRPO"),
    "mas": ("plan_path_mas_atgrpo_repro_cpu", "MAS + AT-GRPO, shared policy"),
    "mas_by_problem": ("plan_path_mas_grpo_by_problem_repro_cpu", "MAS + GRPO grouped by problem, shared policy"),
    "per_role": ("plan_path_mas_full_repro_cpu", "MAS + AT-GRPO, a model per role"),
    "real": ("plan_path_mas_lora_smollm2_repro_cpu", "MAS + AT-GRPO, SmolLM2-135M, a LoRA adapter per role"),
}
TINY = ("sa", "mas", "mas_by_problem", "per_role")  # `make reproduce`; `make reproduce-real` runs "real"
SWAPPED = ("per_role", "real")  # the methods with a policy per role, also evaluated with the two swapped


MAS_TEAMS = ("mas", "mas_by_problem", "per_role", "real")  # the methods that play the whole team


class ReproduceError(Exception):
    """A bad argument or a failed run, said in one line."""


class TrainingFailed(ReproduceError):
    """A training run's main_ppo exited with an error: its seed is reported as failed, the others go on."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m pettingllms_verl.eval.reproduce", description=__doc__.split("\n\n")[0],
                                     epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", default=",".join(TINY), help=f"comma-separated, of {', '.join(METHODS)} (default {','.join(TINY)})")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated training seeds (data order and sampling; default 0,1,2)")
    parser.add_argument("--steps", type=int, default=None, help="training steps per run (default: the recipes' trainer.total_training_steps)")
    parser.add_argument("--episodes", type=int, default=None, help="test problems per evaluation (default all)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="a Hydra override for every run (repeat)")
    parser.add_argument("--out", default=os.path.join(os.environ.get("PETTINGLLMS_ARTIFACTS", "artifacts"), "reproduce"), help="output folder")
    parser.add_argument("--recipes", default=str(runs.RECIPES_DIR), help="recipes folder (default: the package's, pettingllms_verl/recipes)")
    parser.add_argument("--jobs", type=int, default=2,
                        help="training runs, and evaluations, at once (default 2: on CPU one main_ppo keeps about one core busy)")
    args = parser.parse_args(argv)
    args.methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in args.methods if m not in METHODS]
    if unknown or not args.methods:
        parser.error(f"--methods {','.join(args.methods)}: use some of {', '.join(METHODS)}")
    try:
        args.seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        parser.error(f"--seeds {args.seeds}: comma-separated integers, e.g. 0,1,2")
    if not args.seeds:
        parser.error("--seeds: give at least one")
    if args.steps is not None and args.steps < 1:
        parser.error(f"--steps {args.steps}: need at least 1")
    if args.episodes is not None and args.episodes < 1:
        parser.error(f"--episodes {args.episodes}: need at least 1 (leave it out for the whole test split)")
    if args.jobs < 1:
        parser.error(f"--jobs {args.jobs}: need at least 1")
    for name, values in (("--methods", args.methods), ("--seeds", args.seeds)):
        if len(set(values)) != len(values):
            parser.error(f"{name}: {values} names one twice")
    return args


def run_label(method: str, seed: int) -> str:
    return f"{method}_s{seed}"


def finished_steps(checkpoints: Path) -> int:
    """The last step a run saved whole (verl writes this file last), 0 when none."""
    try:
        return int((checkpoints / "latest_checkpointed_iteration.txt").read_text().strip())
    except (FileNotFoundError, ValueError):
        return 0


def check_saved(checkpoints: Path, steps: int, warm: dict, settings: dict) -> int:
    """The steps a run's ``checkpoints`` hold (0 when none), refusing a run saved from another warm start
    or with other settings (``training_settings``) than ``warm`` and ``settings``, or with more steps."""
    done = finished_steps(checkpoints)
    if not done:
        return 0
    saved = {}
    for name in ("warm_start", "settings"):
        path = checkpoints / f"{name}.json"
        try:
            saved[name] = json.loads(path.read_text()) if path.is_file() else None
        except (OSError, ValueError) as error:
            raise ReproduceError(f"{path}: unreadable ({error}); delete {checkpoints} to train that run again") from None
    if saved["warm_start"] != warm:
        models = ", ".join(f"{policy} {start['model']}" for policy, start in warm.items())
        raise ReproduceError(f"{checkpoints} was trained from another warm start than it has now ({models}): "
                             "delete that folder (or the whole --out) to train again, or use another --out")
    changed = changed_keys(saved["settings"], settings) if saved["settings"] is not None else []
    if changed:
        more = f"; and {len(changed) - 5} more" if len(changed) > 5 else ""
        raise ReproduceError(f"{checkpoints} was trained with other settings than its recipe and --set give now (saved -> now): "
                             f"{'; '.join(changed[:5])}{more}. Set them back (the recipe, or --set KEY=VALUE), "
                             "delete that folder to train again, or use another --out")
    if done > steps:
        raise ReproduceError(f"{checkpoints} holds {done} steps, more than --steps {steps}: use another --out, or delete that folder")
    return done


def train(method: str, seed: int, steps: int, args: argparse.Namespace, out: Path, warm: dict, settings: dict | None = None) -> None:
    """One training run through ``main_ppo`` from ``warm`` (``warm_start(args, method)``) with ``settings``
    (``training_settings(method, args)``, composed here when None); resumes from its last checkpoint, skips
    when finished; ``check_saved`` says what it refuses."""
    label = run_label(method, seed)
    checkpoints = out / "checkpoints" / label
    settings = training_settings(method, args) if settings is None else settings
    done = check_saved(checkpoints, steps, warm, settings)
    if done and not (checkpoints / "settings.json").is_file():
        evaluate.say(f"[train {label}] saved before runs recorded their settings: not checked; the current ones recorded")
    checkpoints.mkdir(parents=True, exist_ok=True)
    for name, record in (("warm_start", warm), ("settings", settings)):  # a kill mid-write leaves the old file
        write_whole(checkpoints / f"{name}.json", json.dumps(record))
    log_dir = out / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    keep_curve(log_dir, label, done)
    if done == steps:
        evaluate.say(f"[train {label}] finished earlier ({done} steps): kept")
        return
    command = [
        sys.executable, "-m", "verl.trainer.main_ppo", "--config-path", str(Path(args.recipes).resolve()), "--config-name", METHODS[method][0],
        *args.overrides,
        f"trainer.total_training_steps={steps}",
        f"trainer.experiment_name=repro_{label}",
        f"trainer.default_local_dir={checkpoints.resolve()}",
        "trainer.resume_mode=auto",
        f"data.seed={seed}",
        f"actor_rollout_ref.rollout.seed={seed}",
    ]
    env = {**os.environ, "VERL_FILE_LOGGER_PATH": str(launch_log(log_dir, label).resolve())}
    log_path = log_dir / f"{label}.main_ppo.log"
    evaluate.say(f"[train {label}] main_ppo, steps {done + 1}-{steps}; log: {log_path}")
    started = time.perf_counter()
    with open(log_path, "a") as log:
        code = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=env).returncode
    if code != 0:
        tail = "".join(open(log_path, errors="replace").readlines()[-15:])
        raise TrainingFailed(f"training {label} failed (exit {code}); its log: {log_path}\n{tail}")
    keep_curve(log_dir, label, steps)
    evaluate.say(f"[train {label}] done in {time.perf_counter() - started:.0f} s")


# keys that do not change what a run learns, which a resumed run may change: its length, cadence, names and
# paths, validation, profiling, Ray; and the seeds, which the training command sets per run
NOT_SETTINGS = ("trainer.total_training_steps", "trainer.test_freq", "trainer.save_freq", "trainer.logger", "trainer.project_name",
                "trainer.experiment_name", "trainer.default_local_dir", "trainer.default_hdfs_dir", "trainer.resume_mode",
                "trainer.resume_from_path", "trainer.val_before_train", "trainer.val_only", "trainer.log_val_generations",
                "trainer.rollout_data_dir", "trainer.validation_data_dir", "trainer.max_actor_ckpt_to_keep",
                "trainer.max_critic_ckpt_to_keep", "trainer.del_local_ckpt_after_load", "trainer.esi_redundant_time",
                "trainer.ray_wait_register_center_timeout", "data.val_", "data.validation_shuffle", "data.seed",
                "actor_rollout_ref.rollout.val_kwargs", "actor_rollout_ref.rollout.seed", "actor_rollout_ref.rollout.trace",
                "ray_kwargs", "global_profiler", "pettingllms.paths")


def training_settings(method: str, args: argparse.Namespace) -> dict:
    """What a run's weights depend on besides its warm start: ``method``'s recipe with ``--set`` as dotted
    key -> value, less ``NOT_SETTINGS`` and the profilers'."""
    cfg = OmegaConf.to_container(runs.compose(METHODS[method][0], args.overrides, Path(args.recipes)), enum_to_str=True)

    def flat(node: dict, prefix: str = ""):
        for key, value in node.items():
            if isinstance(value, dict) and value:
                yield from flat(value, f"{prefix}{key}.")
            else:
                yield f"{prefix}{key}", value

    kept = {key: value for key, value in flat(cfg) if not key.startswith(NOT_SETTINGS) and ".profiler." not in key}
    return json.loads(json.dumps(kept))  # as it is read back from settings.json


def changed_keys(saved: dict, now: dict) -> list[str]:
    """``key: saved -> now`` for each key of both ``training_settings`` whose value (or type) differs. A key
    one side lacks is not compared: a newer verl or plugin adds defaults."""
    return [f"{key}: {json.dumps(saved[key])} -> {json.dumps(now[key])}" for key in sorted(saved.keys() & now.keys())
            if (type(saved[key]), saved[key]) != (type(now[key]), now[key])]


def launch_log(log_dir: Path, label: str) -> Path:
    """The file verl's file logger writes in one ``main_ppo`` launch of a run (it starts the file anew)."""
    return log_dir / f"{label}.launch.jsonl"


def keep_curve(log_dir: Path, label: str, upto: int) -> None:
    """Fold the last launch's log (``launch_log``) into the run's curve, ``<label>.jsonl``, keeping the
    steps up to ``upto``: a run resumed from its checkpoint at step ``upto`` plays the later ones again."""
    curve, launch = log_dir / f"{label}.jsonl", launch_log(log_dir, label)
    lines = [line for path in (curve, launch) if path.is_file() for line in path.read_text().splitlines() if line.strip()]
    kept = []
    for line in lines:
        try:
            if json.loads(line)["step"] <= upto:
                kept.append(line)
        except (ValueError, KeyError, TypeError):  # a line cut short by a kill
            continue
    curve.write_text("".join(line + "\n" for line in kept))
    launch.unlink(missing_ok=True)


def train_all(steps: int, args: argparse.Namespace, out: Path, warm: dict, settings: dict) -> dict[str, str]:
    """Every (seed, method) run from ``warm`` (method -> ``warm_start(args, method)``) with ``settings``
    (method -> ``training_settings(method, args)``), ``--jobs`` at once. A run whose training fails is
    recorded and the others go on: returns label -> why, for the failed ones. Any other error (a run
    from another warm start or with other settings, Ctrl-C) drops the runs not started; those running
    finish, and each resumes where it stopped on the next invocation."""
    failed = {}
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:  # each job waits on its own main_ppo process
        futures = {pool.submit(train, method, seed, steps, args, out, warm[method], settings[method]): run_label(method, seed)
                    for seed in args.seeds for method in args.methods}
        try:
            for future in as_completed(futures):
                try:
                    future.result()
                except TrainingFailed as error:
                    evaluate.say(f"[train {futures[future]}] FAILED: reported as failed, the other runs go on")
                    failed[futures[future]] = str(error).splitlines()[0]
        except BaseException:
            pool.shutdown(cancel_futures=True)
            raise
    return failed


def evaluate_runs(specs: list[str], args: argparse.Namespace, out: Path, swap: bool = True) -> dict:
    """``pettingllms-eval`` of ``specs`` on the test split into ``out`` (two-policy runs also swapped
    unless ``swap`` is false); its results.json."""
    argv = [*specs, "--out", str(out), "--recipes", args.recipes, "--jobs", str(args.jobs), *(f"--set={o}" for o in args.overrides)]
    if not swap:
        argv += ["--swap", "none"]
    if args.episodes:
        argv += ["--episodes", str(args.episodes)]
    if evaluate.main(argv) != 0:
        raise ReproduceError(f"evaluation into {out} failed (pettingllms-eval said why above; a started run's log is {out}/runs/<label>/main_ppo.log)")
    return json.loads((out / "results.json").read_text())


def warm_start(args: argparse.Namespace, method: str) -> dict:
    """worker group -> the model it starts from in ``method``'s recipe (with ``--set``), and adapter
    policy -> the adapter folder it starts from (L1), each with what built it (its ``warm_start.json``,
    None when absent)."""
    cfg = runs.compose(METHODS[method][0], args.overrides, Path(args.recipes))
    starts = {**runs.policy_models(cfg), **runs.adapter_starts(cfg)}
    metas = {name: Path(folder) / "warm_start.json" for name, folder in starts.items()}
    return {name: {"model": folder, "warm_start": json.loads(metas[name].read_text()) if metas[name].is_file() else None}
            for name, folder in starts.items()}


def before_sources(methods: list[str], warm: dict) -> dict[str, str]:
    """method -> the method whose "before" evaluation stands for it. Untrained, a team whose roles
    all start from the shared policy's model is the shared team (same weights, same sampling; how a
    method groups its replies matters only in training): playing it again would cost a launch for the
    same distribution. A model per role started apart has its own."""
    def models(method: str) -> set[str]:
        return {start["model"] for start in warm[method].values()}

    def same_team(method: str) -> bool:
        return method in MAS_TEAMS and "mas" in methods and models(method) == models("mas")

    return {method: "mas" if method != "mas" and same_team(method) else method for method in methods}


def fingerprint(specs: list[str], args: argparse.Namespace, warm: dict) -> dict:
    """What a "before" evaluation depends on: runs, problems, overrides and the warm starts of the
    evaluated methods (``warm``: method -> ``warm_start(args, method)``)."""
    return {"specs": specs, "episodes": args.episodes, "overrides": args.overrides,
            "warm": {method: warm[method] for method in (spec.split("=", 1)[0] for spec in specs)}}


def earlier_before(out: Path, specs: list[str], args: argparse.Namespace, warm: dict) -> dict | None:
    """The "before" results of an earlier invocation when made of the same runs and warm start."""
    try:
        if json.loads((out / "before" / "fingerprint.json").read_text()) != fingerprint(specs, args, warm):
            return None
        before = json.loads((out / "before" / "results.json").read_text())
    except (OSError, ValueError):
        return None
    evaluate.say(f"[before] evaluated earlier with the same runs and warm start: {out / 'before'} kept")
    return before


def _role_rewards(row: dict | None) -> dict[str, float]:
    return {role: stats["reward_mean"] for role, stats in (row or {}).get("roles", {}).items()}


def pooled(rows: list[dict]) -> tuple[float, int] | None:
    """(success, episodes) of evaluations pooled: every episode counts once, whatever its seed."""
    episodes = sum(row["episodes"] for row in rows)
    return (sum(row["success"] * row["episodes"] for row in rows) / episodes, episodes) if episodes else None


def difference(a: tuple[float, int] | None, b: tuple[float, int] | None) -> dict | None:
    """a - b of two pooled success rates, with the binomial standard error of the difference and the
    difference in those standard errors (``z``)."""
    if not a or not b:
        return None
    se = math.sqrt(binomial_se(*a) ** 2 + binomial_se(*b) ** 2)
    return {"diff": a[0] - b[0], "se": se, "z": (a[0] - b[0]) / se if se else None}


def aggregate(before: dict, after: dict, methods: list[str], seeds: list[int], sources: dict[str, str] | None = None,
              failed: dict[str, str] | None = None) -> list[dict]:
    """One row per method (and per-role swapped): test success before (the row of ``sources[method]``,
    ``before_sources``; default its own) and after, per seed and pooled over seeds with its standard
    error, the gain over before in standard errors of the difference; per role its mean reward before
    and after (mean over seeds: a role can learn while the team does not). A seed in ``failed``
    (label -> why) is listed as failed and left out of every figure."""
    base = {row["label"]: row for row in before["rows"] if not row["swapped"]}
    table = []
    for method in methods:
        for swapped in ([False, True] if method in SWAPPED else [False]):
            labels = {run_label(method, s): s for s in seeds}
            rows = {labels[row["label"]]: row for row in after["rows"] if row["swapped"] == swapped and row["label"] in labels}
            done = [s for s in seeds if s in rows]
            values = [rows[s]["success"] for s in done]
            start = base.get((sources or {}).get(method, method))  # the method's recipe at its warm start
            start_pooled = (start["success"], start["episodes"]) if start else None
            after_pooled = pooled([rows[s] for s in done])
            after_roles = [_role_rewards(rows[s]) for s in done]
            table.append({
                "method": method, "recipe": METHODS[method][0], "name": METHODS[method][1] + (", policies swapped" if swapped else ""), "swapped": swapped,
                "before": start["success"] if start else None, "before_episodes": start["episodes"] if start else None,
                "before_se": binomial_se(*start_pooled) if start_pooled else None,
                "after_per_seed": {s: rows[s]["success"] for s in done}, "after_episodes_per_seed": {s: rows[s]["episodes"] for s in done},
                "failed_seeds": {s: (failed or {})[label] for label, s in labels.items() if label in (failed or {})},
                "after_mean": sum(values) / len(values) if values else None,
                "after_min": min(values) if values else None, "after_max": max(values) if values else None,
                "after_pooled": after_pooled[0] if after_pooled else None, "after_episodes": after_pooled[1] if after_pooled else 0,
                "after_se": binomial_se(*after_pooled) if after_pooled else None,
                "gain": None if swapped else difference(after_pooled, start_pooled),
                "role_reward_before": _role_rewards(start),
                "role_reward_after": {role: sum(r[role] for r in after_roles) / len(after_roles)
                                      for role in sorted(set().union(*after_roles)) if all(role in r for r in after_roles)},
            })
    return table


# (a, b): the after-training comparisons the reproduction reports, by method (and swapped)
COMPARISONS = [(("mas", False), ("sa", False)), (("per_role", False), ("sa", False)), (("mas", False), ("mas_by_problem", False)),
               (("per_role", False), ("mas", False)), (("per_role", True), ("per_role", False)), (("real", True), ("real", False))]


def _after(row: dict) -> tuple[float, int] | None:
    """A table row's (pooled success, episodes) after training; None when no seed finished."""
    return (row["after_pooled"], row["after_episodes"]) if row["after_episodes"] else None


def comparisons(table: list[dict]) -> list[dict]:
    """After training, each pair of ``COMPARISONS`` present in ``table``: a - b pooled over seeds."""
    rows = {(row["method"], row["swapped"]): row for row in table}
    found = []
    for a, b in COMPARISONS:
        if a in rows and b in rows:
            diff = difference(_after(rows[a]), _after(rows[b]))
            if diff:
                found.append({"a": rows[a]["name"], "b": rows[b]["name"], **diff})
    return found


def _diff_text(diff: dict | None) -> str:
    return "-" if diff is None else f"{diff['diff']:+.3f} ± {diff['se']:.3f} ({diff['z']:+.1f} SE)"


def markdown(table: list[dict], meta: dict) -> str:
    fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
    lines = [
        "# Reproduction: Plan-Path 4x4 in one turn (routes of 2-3 moves), models warm-started on noisy demonstrations",
        "",
        f"Test success (share of {meta['episodes']} test problems solved, sampled at T = 1), before training (the warm start) "
        f"and after {meta['steps']} steps (each run's best step on val), over seeds {', '.join(map(str, meta['seeds']))}: "
        "pooled over seeds (every episode counts once) ± its binomial standard error (episodes), and the gain over the warm "
        "start in standard errors of the difference. "
        f"This invocation took {meta['wall_s'] / 60:.0f} min, not counting the warm start and data made before it "
        "(`make reproduce` makes both) nor training runs kept from an earlier invocation.",
        "",
        "| method | before | after | gain | " + " | ".join(f"seed {s}" for s in meta["seeds"]) + " | role reward: before -> after (mean) |",
        "|---|---|---|---|" + "---|" * len(meta["seeds"]) + "---|",
    ]
    for row in table:
        roles = ", ".join(f"{role} {fmt(row['role_reward_before'].get(role))} -> {fmt(reward)}" for role, reward in row["role_reward_after"].items())
        before = "-" if row["swapped"] or row["before"] is None else f"{row['before']:.3f} ± {row['before_se']:.3f} ({row['before_episodes']})"
        after = "-" if row["after_pooled"] is None else f"{row['after_pooled']:.3f} ± {row['after_se']:.3f} ({row['after_episodes']})"
        seeds = ["failed" if s in row["failed_seeds"] else fmt(row["after_per_seed"].get(s)) for s in meta["seeds"]]
        lines.append("| " + " | ".join([row["name"], before, after, _diff_text(row["gain"]), *seeds, roles or "-"]) + " |")
    lines += ["", "After training, pooled over seeds (a - b ± the standard error of the difference):", ""]
    lines += [f"- {c['a']} - {c['b']}: {_diff_text(c)}" for c in meta.get("comparisons", [])] or ["- (no pair of methods ran)"]
    lines += ["", "Role reward: the mean reward of a role's replies in the test episodes (`before/` and `after/results.json`).",
              "", "Warm starts: " + "; ".join(f"{METHODS[method][1]}: " + ", ".join(f"{policy} `{model}`" for policy, model in policies.items())
                                              for method, policies in meta["warm_starts"].items()) + "."]
    for method, source in meta.get("before_of", {}).items():
        lines += ["", f"Before training, {METHODS[method][1]} is the team of {METHODS[source][1]} (every role from the same model): "
                  "one evaluation stands for both."]
    for row in table:
        for seed, why in row["failed_seeds"].items():
            if not row["swapped"]:
                lines += ["", f"**{row['name']}, seed {seed}: training failed**, left out of the figures: {why}"]
    return "\n".join(lines) + "\n"


def plot_table(table: list[dict], out: Path) -> str:
    """``reproduce.png``: test success per method before and after training (mean over seeds, min-max bar)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    labelled = set()

    def label(text: str) -> str | None:  # each legend entry once
        return None if text in labelled or labelled.add(text) else text

    for i, row in enumerate(table):
        if row["before"] is not None and not row["swapped"]:
            ax.bar(i - 0.2, row["before"], 0.4, color="lightgrey", label=label("before (warm start)"))
        if row["after_mean"] is not None:
            spread = [[row["after_mean"] - row["after_min"]], [row["after_max"] - row["after_mean"]]]
            ax.bar(i + 0.2, row["after_mean"], 0.4, yerr=spread, capsize=4, color="tab:red" if row["swapped"] else "tab:blue",
                   label=label("after, swapped" if row["swapped"] else "after (mean, min-max over seeds)"))
    ax.set_xticks(range(len(table)), [row["name"].replace(", ", ",\n", 1) for row in table], fontsize=8)
    ax.set_ylabel("success on the test split")
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / "reproduce.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # composing a recipe imports verl, which warns once per optional engine it lacks (megatron, ...)
    warnings.filterwarnings("ignore", message=r".* engine is not available", category=UserWarning)
    started = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        steps = args.steps or int(runs.compose(METHODS[args.methods[0]][0], args.overrides, Path(args.recipes)).trainer.total_training_steps)
        warm = {method: warm_start(args, method) for method in args.methods}  # composes recipes: Hydra's global state is for one thread
        settings = {method: training_settings(method, args) for method in args.methods}
        for method in args.methods:  # refused before the "before" evaluation, not an hour into it
            for seed in args.seeds:
                check_saved(out / "checkpoints" / run_label(method, seed), steps, warm[method], settings[method])
        # each method's recipe at its warm start, once per distinct team (a model per role may start its roles apart: --set)
        sources = before_sources(args.methods, warm)
        before_specs = [f"{name}={METHODS[name][0]}" for name in args.methods if sources[name] == name]
        before = earlier_before(out, before_specs, args, warm)
        if before is None:
            before = evaluate_runs(before_specs, args, out / "before", swap=False)
            (out / "before" / "fingerprint.json").write_text(json.dumps(fingerprint(before_specs, args, warm)))
        failed = train_all(steps, args, out, warm, settings)
        after_specs = [f"{run_label(m, s)}={METHODS[m][0]}@{out / 'checkpoints' / run_label(m, s)}"
                       for s in args.seeds for m in args.methods if run_label(m, s) not in failed]
        after = evaluate_runs(after_specs, args, out / "after") if after_specs else {"rows": []}
    except (ReproduceError, runs.EvalError) as error:
        print(f"reproduce: {error}", file=sys.stderr)
        return 1
    table = aggregate(before, after, args.methods, args.seeds, sources, failed)
    meta = {"steps": steps, "seeds": args.seeds, "episodes": next((r["episodes"] for r in after["rows"]), None),
            "wall_s": time.perf_counter() - started, "overrides": args.overrides,
            "warm_starts": {m: {policy: Path(start["model"]).name for policy, start in warm[m].items()} for m in args.methods},
            "before_of": {m: source for m, source in sources.items() if source != m},
            "comparisons": comparisons(table), "failed": failed}
    (out / "reproduce.json").write_text(json.dumps({**meta, "rows": table}, indent=1))
    (out / "reproduce.md").write_text(markdown(table, meta))
    logs = {m: [str(out / "logs" / f"{run_label(m, s)}.jsonl") for s in args.seeds if run_label(m, s) not in failed] for m in args.methods}
    curves = [f"--curves={m}=" + ",".join(files) for m, files in logs.items() if files]
    if plots.main([*curves, "--out", str(out)]) != 0:
        print("reproduce: the learning curves could not be drawn (see above); the table is written", file=sys.stderr)
    plot_table(table, out)
    print(markdown(table, meta))
    print(f"wrote {out}/reproduce.md, reproduce.json, reproduce.png, learning_curves.png")
    if failed:
        print(f"reproduce: {len(failed)} training run(s) failed and are reported as failed: {', '.join(sorted(failed))} "
              "(run the same command again to retry them; finished runs are kept)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
