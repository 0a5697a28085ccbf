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
- ``control``: its null-training control, the same runs with each reward shuffled within its AT-GRPO
  group (``plan_path_mas_full_control_repro_cpu``); the primary claim (``PRIMARY``, ``--primary``) is
  ``per_role`` against it on the final confirmation split, declared into ``primary.json`` before any
  "after" exists;
- ``per_role_async`` (not in the default ``--methods``): ``per_role`` trained under verl's colocate_async
  schedule (``plan_path_mas_full_async_repro_cpu``, docs/async.md), compared with ``per_role`` after training;
- ``ppo`` (not in the default ``--methods``): MAS + PPO, the shared policy of ``mas`` trained with a
  critic (``algorithm.adv_estimator=gae``) instead of AT-GRPO (``plan_path_mas_ppo_repro_cpu``);
- ``program`` (not in the default ``--methods``; ``make reproduce-program`` runs it beside ``mas``): the
  team of ``mas`` written as a LangGraph program (``examples/agents/plan_path_langgraph.py``) that calls
  the shared policy through the gateway, tree-sampled by replay (``plan_path_program_repro_cpu``; run
  from the repository root). It plays its own "before": the program, not the environment, plays it;
- ``real`` (not in the default ``--methods``; ``make reproduce-real``): the real model, SmolLM2-135M
  with a LoRA adapter per role, each warm-started on its role's demonstrations
  (``plan_path_mas_lora_smollm2_repro_cpu``), also evaluated swapped.

Each method trains once per seed through ``main_ppo`` (validating on the val split; a rerun resumes
a run cut short and skips a finished one, when it was made from the same warm start, with the same
training settings and by the same code; otherwise it trains it again, saying why, the earlier run kept
aside), ``--jobs`` runs at once. ``pettingllms-eval`` then plays, on each held-out split
(``--splits``: the development test split and the final confirmation split), each method's recipe at its
warm start ("before", once per training seed, sampling with that seed; kept from an earlier invocation
only when the package's source, the composed evaluation config, the problems and the warm start are
the same, else evaluated again with the reason said; a team whose policies start apart also
swapped) and each run's best step on val and its last step ("after",
sampling with the run's seed; kept likewise when the run's weights are also the same). ``--set`` can start the roles of ``per_role`` apart, e.g. ``--methods
per_role --set ++pettingllms.policies.plan_policy.overrides.model.path=DIR``. A training run that
fails is reported as failed (its seed is left out of the method's figures, and said so); the others go
on. Writes to --out: ``reproduce.md`` and ``reproduce.json`` (per split and method, success before
and after training per seed and as a mean over seeds with its t interval between runs, the gain over
the warm start across runs (Welch's t) and paired over problems (bootstrap), the comparisons between
methods, the primary claim's test and every other p with its Holm adjustment, the swap's difference in
differences, collapsed runs, each warm start's sha256; ``eval/stats.py``), ``reproduce.png`` (the same as bars), ``learning_curves.png``, the
evaluations (``before/<split>/s<seed>/``, ``after/<split>/s<seed>/``), the training logs (``logs/``)
and checkpoints (``checkpoints/``). ``--archive DIR`` keeps what a new machine needs to go on, small
enough to commit (``eval/archive.py``). ``--report`` writes the table into --out again from the
evaluations saved in --archive (without it, in --out), playing and training nothing: all must be
there, made by one source.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
import warnings
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

import pandas as pd
from omegaconf import OmegaConf

from pettingllms_verl.eval import __main__ as evaluate
from pettingllms_verl.envs.splits import task_key
from pettingllms_verl.eval import archive, plots, runs, stats
from pettingllms_verl.eval.results import binomial_se
from pettingllms_verl.rollout import faults
from pettingllms_verl.files import write_whole

METHODS = {  # name -> (recipe, what the tables call it)
    "sa": ("plan_path_sa_grpo_repro_cpu", "SA + GRPO"),
    "mas": ("plan_path_mas_atgrpo_repro_cpu", "MAS + AT-GRPO, shared policy"),
    "mas_by_problem": ("plan_path_mas_grpo_by_problem_repro_cpu", "MAS + GRPO grouped by problem, shared policy"),
    "per_role": ("plan_path_mas_full_repro_cpu", "MAS + AT-GRPO, a model per role"),
    "control": ("plan_path_mas_full_control_repro_cpu", "the same, null-training control (rewards shuffled within groups)"),
    "per_role_async": ("plan_path_mas_full_async_repro_cpu", "the same, trained asynchronously (mas_colocate_async)"),
    "ppo": ("plan_path_mas_ppo_repro_cpu", "MAS + PPO (a critic), shared policy"),
    "program": ("plan_path_program_repro_cpu", "MAS + AT-GRPO, shared policy, the team as a LangGraph program"),
    "real": ("plan_path_mas_lora_smollm2_repro_cpu", "MAS + AT-GRPO, SmolLM2-135M, a LoRA adapter per role"),
}
TINY = ("sa", "mas", "mas_by_problem", "per_role", "control")  # `make reproduce`; `make reproduce-real` runs "real"
SWAPPED = ("per_role", "per_role_async", "real")  # the methods with a policy per role, also evaluated with the two swapped
CONTROL_OF = {"control": "per_role"}  # a null-training control -> the method it is the control of: untrained, the same team


# the methods whose whole team the environment plays ("program" plays it as a program: its "before" is its own)
MAS_TEAMS = ("mas", "mas_by_problem", "per_role", "control", "per_role_async", "ppo", "real")
# the held-out splits, in report order: the development test split (read when the task and the training length
# were chosen: docs/reproduction.md), the development confirmation split (frozen before an earlier final run, read
# by several experiments since) and the final confirmation split (frozen when the primary claim was declared, read for it)
SPLITS = ("test", "confirm", "final")
DEFAULT_SPLITS = ("test", "final")
CONFIRMATIONS = ("confirm", "final")  # the splits nothing is chosen on: each checked disjoint from every other
SPLIT_NAMES = {"test": "Development test split", "confirm": "Development confirmation split", "final": "Final confirmation split"}
# The primary claim of `make reproduce`, declared before its runs (docs/reproduction.md, "The primary claim"): the team
# with a model per role, trained, against its null-training control, trained alike without the reward's information.
PRIMARY = {"a": "per_role", "b": "control", "split": "final", "checkpoint": "best on val",
           "statistic": "success after training (each run's best step on val), mean over training runs, a - b",
           "test": "Welch's t over training runs, two-sided", "alpha": 0.05}
COLLAPSE_STEPS = 5  # a run with this many training steps in a row without a gradient (actor/grad_norm 0) counts as collapsed
PRIMARY_FILE = "primary.json"  # in --out (and --archive): the primary claim as declared, before any "after"
LAST = "-last"  # an "after" evaluation's label suffix for a run's last step (the plain label: its best step on val)


class ReproduceError(Exception):
    """A bad argument or a failed run, said in one line."""


class TrainingFailed(ReproduceError):
    """A training run's main_ppo exited with an error: its seed is reported as failed, the others go on."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m pettingllms_verl.eval.reproduce", description=__doc__.split("\n\n")[0],
                                     epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", default=",".join(TINY), help=f"comma-separated, of {', '.join(METHODS)} (default {','.join(TINY)})")
    parser.add_argument("--seeds", default="0,1,2,3,4", help="comma-separated training seeds (data order and sampling; default 0,1,2,3,4)")
    parser.add_argument("--steps", type=int, default=None, help="training steps per run (default: the recipes' trainer.total_training_steps)")
    parser.add_argument("--episodes", type=int, default=None, help="test problems per evaluation (default all)")
    parser.add_argument("--splits", default=",".join(DEFAULT_SPLITS),
                        help=f"comma-separated splits evaluated before and after, of {', '.join(SPLITS)} (default {','.join(DEFAULT_SPLITS)}: "
                             "the development test split and the final confirmation split, read for the primary claim alone)")
    parser.add_argument("--primary", default="auto", metavar="A-B@SPLIT",
                        help=f"the one primary claim, declared into --out/primary.json before any evaluation after training exists: "
                             f"method A's success after training minus method B's on SPLIT, Welch's t over the runs; every other "
                             f"comparison is secondary, Holm-adjusted. 'none': no primary claim; 'auto' (default): "
                             f"{PRIMARY['a']}-{PRIMARY['b']}@{PRIMARY['split']} where those methods and that split are asked for, else none")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="a Hydra override for every run (repeat)")
    parser.add_argument("--out", default=os.path.join(os.environ.get("PETTINGLLMS_ARTIFACTS", "artifacts"), "reproduce"), help="output folder")
    parser.add_argument("--recipes", default=str(runs.RECIPES_DIR), help="recipes folder (default: the package's, pettingllms_verl/recipes)")
    parser.add_argument("--archive", default=None, metavar="DIR",
                        help="a folder to keep what outlives this machine (eval/archive.py): each finished evaluation, and each finished "
                             "run of LoRA adapters as the adapters its evaluations play; read back where --out lacks them or holds them made otherwise")
    parser.add_argument("--report", action="store_true",
                        help="write reproduce.md/json/png into --out again from the evaluations saved in --archive (without it: in --out), "
                             "playing and training nothing: each must be there, all made by one source")
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
    args.splits = [split.strip() for split in args.splits.split(",") if split.strip()]
    if not args.splits or any(split in ("train", "val") for split in args.splits):
        parser.error(f"--splits {','.join(args.splits)}: name held-out splits (test, confirm): train and val are used to train and choose")
    for name, values in (("--methods", args.methods), ("--seeds", args.seeds), ("--splits", args.splits)):
        if len(set(values)) != len(values):
            parser.error(f"{name}: {values} names one twice")
    try:
        args.primary = primary_claim(args.primary, args.methods, args.splits)
    except ValueError as error:
        parser.error(f"--primary {args.primary}: {error}")
    return args


def primary_claim(spec: str, methods: list[str], splits: list[str]) -> dict | None:
    """``--primary``: the claim it declares (``PRIMARY``'s keys), or None for 'none'."""
    if spec == "none":
        return None
    if spec == "auto":
        return dict(PRIMARY) if {PRIMARY["a"], PRIMARY["b"]} <= set(methods) and PRIMARY["split"] in splits else None
    pair, _, split = spec.partition("@")
    a, _, b = pair.partition("-")
    if not (a and b and split):
        raise ValueError("write it as A-B@SPLIT (e.g. per_role-control@final), or none")
    if a == b:
        raise ValueError(f"{a} against itself: name two methods")
    missing = [name for name in (a, b) if name not in methods] + ([split] if split not in splits else [])
    if missing:
        raise ValueError(f"{', '.join(missing)} not among --methods {','.join(methods)} / --splits {','.join(splits)}")
    return {**PRIMARY, "a": a, "b": b, "split": split}


def run_label(method: str, seed: int) -> str:
    return f"{method}_s{seed}"


def finished_steps(checkpoints: Path) -> int:
    """The last step a run saved whole (verl writes this file last), 0 when none."""
    try:
        return int((checkpoints / "latest_checkpointed_iteration.txt").read_text().strip())
    except (FileNotFoundError, ValueError):
        return 0


def stale(checkpoints: Path, warm: dict, settings: dict, source: str) -> list[str]:
    """Why a run saved in ``checkpoints`` cannot be kept (empty: it can): it was trained from another
    warm start than ``warm``, with other settings (``training_settings``) than ``settings``, or by
    other code than ``source`` (``source_hash``), or it does not say (its records are missing or unreadable)."""
    if not finished_steps(checkpoints):
        return []
    saved, reasons = {}, []
    for name in ("warm_start", "settings", "source"):
        path = checkpoints / f"{name}.json"
        try:
            saved[name] = json.loads(path.read_text())
        except FileNotFoundError:
            saved[name] = None
            reasons.append(f"it does not record its {name.replace('_', ' ')} ({path.name})")
        except (OSError, ValueError) as error:
            saved[name] = None
            reasons.append(f"its {path.name} is unreadable ({error})")
    if saved["warm_start"] is not None and saved["warm_start"] != warm:
        reasons.append(f"it was trained from another warm start than it has now ({'; '.join(warm_changes(saved['warm_start'], warm))})")
    changed = changed_keys(saved["settings"], settings) if isinstance(saved["settings"], dict) else []
    if changed:
        more = f"; and {len(changed) - 5} more" if len(changed) > 5 else ""
        reasons.append(f"it was trained with other settings than its recipe and --set give now (saved -> now): {'; '.join(changed[:5])}{more}")
    if saved["source"] is not None and saved["source"] != source:
        reasons.append(f"the package's source changed (sha256 {str(saved['source'])[:12]} -> {source[:12]})")
    return reasons


def check_saved(checkpoints: Path, steps: int, reasons: list[str]) -> int:
    """The steps of a run's ``checkpoints`` that can be kept: 0 when none, or when there are
    ``reasons`` (``stale``) to train it again; refuses a run with more steps than asked for."""
    done = 0 if reasons else finished_steps(checkpoints)
    if done > steps:
        raise ReproduceError(f"{checkpoints} holds {done} steps, more than --steps {steps}: use another --out, or delete that folder")
    last = checkpoints / f"global_step_{done}"
    if 0 < done < steps and (not last.is_dir() or runs.adapters_only(str(last))):
        raise ReproduceError(f"{checkpoints} holds {done} steps without verl's checkpoint of step {done} (restored from --archive: "
                             f"adapters alone), which cannot be trained on to --steps {steps}: use another --out, or delete that folder")
    return done


def train(method: str, seed: int, steps: int, args: argparse.Namespace, out: Path, warm: dict, settings: dict | None = None) -> None:
    """One training run through ``main_ppo`` from ``warm`` (``warm_start(args, method)``) with ``settings``
    (``training_settings(method, args)``, composed here when None) and this package's code; resumes from
    its last checkpoint, skips when finished. A saved run that ``stale`` finds made otherwise is trained
    again from the start, the earlier one moved to ``checkpoints/<run>.replaced`` (its curve beside it)."""
    label = run_label(method, seed)
    checkpoints = out / "checkpoints" / label
    settings = training_settings(method, args) if settings is None else settings
    source = source_hash()
    log_dir = out / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    reasons = stale(checkpoints, warm, settings, source)
    done = check_saved(checkpoints, steps, reasons)
    if reasons:
        replaced = checkpoints.with_name(f"{label}.replaced")
        shutil.rmtree(replaced, ignore_errors=True)
        checkpoints.rename(replaced)
        curve = log_dir / f"{label}.jsonl"
        if curve.is_file():
            curve.rename(replaced / "curve.jsonl")
        evaluate.say(f"[train {label}] trained again from the start: {'; '.join(reasons)}. The earlier run: {replaced}")
    checkpoints.mkdir(parents=True, exist_ok=True)
    if done < steps:  # its weights change: an evaluation of the earlier ones no longer stands for it
        (checkpoints / "trained.json").unlink(missing_ok=True)
    for name, record in (("warm_start", warm), ("settings", settings), ("source", source)):  # a kill mid-write leaves the old file
        write_whole(checkpoints / f"{name}.json", json.dumps(record))
    keep_curve(log_dir, label, done)
    if done == steps:
        if trained_id(checkpoints) is None:  # finished by a version that wrote no id: these weights get one now
            mark_trained(checkpoints, steps)
        evaluate.say(f"[train {label}] finished earlier ({done} steps): kept")
        keep_run(checkpoints, label, args, out)
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
        *run_threads(args),
    ]
    env = {**os.environ, "VERL_FILE_LOGGER_PATH": str(launch_log(log_dir, label).resolve())}
    log_path = log_dir / f"{label}.main_ppo.log"
    evaluate.say(f"[train {label}] main_ppo, steps {done + 1}-{steps}; log: {log_path}")
    started = time.perf_counter()
    with open(log_path, "a") as log:
        code = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=env).returncode
    add_wall_time(checkpoints, time.perf_counter() - started)
    if code != 0:
        why = evaluate.why_it_stopped(log_path)
        stop = next((line for line in why.splitlines() if faults.STOPPED in line), None)  # a fault stop: its reason in the table
        raise TrainingFailed(f"training {label} failed (exit {code}){': ' + stop if stop else ''}; its log: {log_path}\n{why}")
    keep_curve(log_dir, label, steps)
    mark_trained(checkpoints, steps)
    evaluate.say(f"[train {label}] done in {time.perf_counter() - started:.0f} s")
    keep_run(checkpoints, label, args, out)


def keep_warm_starts(warm: dict, args: argparse.Namespace) -> None:
    """Each adapter warm start into ``--archive``; refused when the archive holds other weights under its
    name (those its kept runs were made from): going on would redo them all."""
    starts = {Path(start["model"]): start["sha256"] for method in warm for start in warm[method].values()}
    kept = {folder: archive.keep_warm(folder, sha, Path(args.archive), weights_sha256) for folder, sha in starts.items()}
    other = sorted(folder.name for folder, state in kept.items() if state == "other")
    if other:
        raise ReproduceError(f"{args.archive}/warm holds other weights than {', '.join(str(f) for f in kept if f.name in other)} "
                             "(the warm starts its runs were made from): copy them back (make reproduce-real REAL_ARCHIVE=...: "
                             "delete the warm start first) to go on with those runs, or give another --archive")
    if any(kept.values()):
        evaluate.say(f"[archive] {args.archive}/warm: {', '.join(sorted(folder.name for folder, state in kept.items() if state))}")


def restore_run(checkpoints: Path, steps: int, warm: dict, settings: dict, source: str, args: argparse.Namespace, out: Path) -> None:
    """The run kept in ``--archive`` into ``checkpoints`` when it stands for the one asked for (made alike,
    ``stale``, and finished at ``steps``) and the one there does not (a run cut short, or made otherwise)."""
    kept = Path(args.archive) / checkpoints.relative_to(out)
    if not (kept / "trained.json").is_file() or finished_steps(kept) != steps or stale(kept, warm, settings, source):
        return
    if finished_steps(checkpoints) == steps and not stale(checkpoints, warm, settings, source):
        return
    archive.restore_run(kept, checkpoints, out / "logs" / f"{checkpoints.name}.jsonl")
    evaluate.say(f"[train {checkpoints.name}] restored from {kept} (its adapters, not verl's checkpoint"
                 + (f"; the one that was there: {checkpoints.name}.replaced)" if checkpoints.with_name(checkpoints.name + ".replaced").exists() else ")"))


def keep_run(checkpoints: Path, label: str, args: argparse.Namespace, out: Path) -> None:
    """A finished run into ``--archive`` (when given): the steps its evaluations play (its best on val and
    its last), if its weights are adapters."""
    if not args.archive:
        return
    try:
        best = Path(runs.resolve_checkpoint(str(checkpoints), "best-val"))
    except runs.EvalError as error:
        evaluate.say(f"[train {label}] not kept in {args.archive}: {error}")
        return
    played = [best, *filter(None, [last_step(checkpoints, finished_steps(checkpoints))])]
    if archive.keep_run(checkpoints, played, out / "logs" / f"{label}.jsonl", out, Path(args.archive)):
        evaluate.say(f"[train {label}] kept in {args.archive}: its records and the adapters of {', '.join(step.name for step in played)}")
    else:
        evaluate.say(f"[train {label}] not kept in {args.archive}: it holds a full model (too large to keep; its evaluations are kept)")


def run_threads(args: argparse.Namespace) -> list[str]:
    """The overrides that give a training run's trainer (its Ray workers) and its hf rollout server each
    the cores of its share, ``--jobs`` runs at once: a synchronous step generates, then updates, so the
    two never compute at once. Ray starts an actor without ``num_cpus`` with one thread, and the tiny
    recipes give the server one: a core would idle through both. Either is left out where ``--set`` names it."""
    share = max(1, runs.usable_cores() // args.jobs)
    wanted = {"OMP_NUM_THREADS": f'++ray_kwargs.ray_init.runtime_env.env_vars.OMP_NUM_THREADS="{share}"',
              "torch_threads": f"++actor_rollout_ref.rollout.engine_kwargs.hf.torch_threads={share}"}
    return [override for name, override in wanted.items() if not any(name in given for given in args.overrides)]


def add_wall_time(checkpoints: Path, seconds: float) -> None:
    write_whole(checkpoints / archive.WALL_FILE, json.dumps(launch_times(checkpoints) + [round(seconds, 1)]))


def launch_times(checkpoints: Path) -> list[float]:
    """The seconds of each ``main_ppo`` launch a run took (empty where none was timed, e.g. restored from --archive)."""
    try:
        return [float(s) for s in json.loads((checkpoints / archive.WALL_FILE).read_text())]
    except (OSError, ValueError, TypeError):
        return []


def mark_trained(checkpoints: Path, steps: int) -> None:
    write_whole(checkpoints / "trained.json", json.dumps({"steps": steps, "id": uuid.uuid4().hex}))


def trained_id(checkpoints: Path) -> str | None:
    """Which weights a finished run holds: an id written when its training last finished (a run trained
    again, or on to more steps, gets a new one) with the step an evaluation plays (the best on val), so
    that an "after" evaluation is kept only for the same weights; None when the run does not record one
    or its checkpoints moved on since (steps saved outside this command)."""
    try:
        record = json.loads((checkpoints / "trained.json").read_text())
        if record["steps"] != finished_steps(checkpoints):
            return None
        return f"{record['id']}:{Path(runs.resolve_checkpoint(str(checkpoints), 'best-val')).name}"
    except (OSError, ValueError, KeyError, TypeError, runs.EvalError):
        return None


# keys that do not change what a run learns, which a resumed run may change: its length, cadence, names and
# paths, validation, profiling, Ray and threads; and the seeds, which the training command sets per run
NOT_SETTINGS = ("trainer.total_training_steps", "trainer.test_freq", "trainer.save_freq", "trainer.logger", "trainer.project_name",
                "trainer.experiment_name", "trainer.default_local_dir", "trainer.default_hdfs_dir", "trainer.resume_mode",
                "trainer.resume_from_path", "trainer.val_before_train", "trainer.val_only", "trainer.log_val_generations",
                "trainer.rollout_data_dir", "trainer.validation_data_dir", "trainer.max_actor_ckpt_to_keep",
                "trainer.max_critic_ckpt_to_keep", "trainer.del_local_ckpt_after_load", "trainer.esi_redundant_time",
                "trainer.ray_wait_register_center_timeout", "data.val_", "data.validation_shuffle", "data.seed",
                "actor_rollout_ref.rollout.val_kwargs", "actor_rollout_ref.rollout.seed", "actor_rollout_ref.rollout.trace",
                "ray_kwargs", "actor_rollout_ref.rollout.engine_kwargs.hf.torch_threads", "global_profiler", "pettingllms.paths")


PROGRAM_SOURCE = "pettingllms.program.source_sha256"  # in flat_config: a team program's own files, outside the package


def flat_config(recipe: str, overrides: list[str], recipes_dir: Path) -> dict:
    """``recipe`` composed with ``overrides`` as dotted key -> value, as it reads back from JSON; for a
    team program, ``PROGRAM_SOURCE`` too (``program_source``): its weights and scores depend on that code."""
    cfg = OmegaConf.to_container(runs.compose(recipe, overrides, recipes_dir), enum_to_str=True)

    def flat(node: dict, prefix: str = ""):
        for key, value in node.items():
            if isinstance(value, dict) and value:
                yield from flat(value, f"{prefix}{key}.")
            else:
                yield f"{prefix}{key}", value

    flat_cfg = json.loads(json.dumps(dict(flat(cfg))))
    files = program_files(flat_cfg.get("pettingllms.program.target"), flat_cfg.get("pettingllms.program.command"))
    if files:
        flat_cfg[PROGRAM_SOURCE] = program_source(files, recipe)
    return flat_cfg


def program_files(target: str | None, command: list | None) -> list[str]:
    """The files of a team program, as its recipe names them: a ``file.py:function`` target's file, and
    a command's arguments that end in ``.py`` (a module target is the package's or installed code)."""
    found = [target.rpartition(":")[0]] if target and target.rpartition(":")[0].endswith(".py") else []
    return found + [str(arg) for arg in (command or [])[1:] if str(arg).endswith(".py")]


def program_source(files: list[str], recipe: str) -> str:
    """sha256 of a program's ``files``, read from here (where main_ppo starts and reads them)."""
    digest = hashlib.sha256()
    for name in files:
        path = Path(name).expanduser()
        if not path.is_file():
            raise ReproduceError(f"{recipe}: its team program {name} is not found from {Path.cwd()}: "
                                 "run from the folder its path is relative to (the repository root for the shipped examples)")
        digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def training_settings(method: str, args: argparse.Namespace) -> dict:
    """What a run's weights depend on besides its warm start: ``method``'s recipe with ``--set`` as dotted
    key -> value, less ``NOT_SETTINGS`` and the profilers'."""
    cfg = flat_config(METHODS[method][0], args.overrides, Path(args.recipes))
    return {key: value for key, value in cfg.items() if not key.startswith(NOT_SETTINGS) and ".profiler." not in key}


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


def evaluate_runs(specs: list[str], args: argparse.Namespace, out: Path, seed: int, split: str, swap: bool = True) -> dict:
    """``pettingllms-eval`` of ``specs`` on ``split`` into ``out``, sampling with rollout seed ``seed``
    (two-policy runs also swapped unless ``swap`` is false): its results.json, with ``outcomes``."""
    argv = [*specs, "--out", str(out), "--recipes", args.recipes, "--jobs", str(args.jobs), "--split", split,
            *(f"--set={o}" for o in eval_overrides(args, seed))]
    if not swap:
        argv += ["--swap", "none"]
    if args.episodes:
        argv += ["--episodes", str(args.episodes)]
    if evaluate.main(argv) != 0:
        raise ReproduceError(f"evaluation into {out} failed (pettingllms-eval said why above; a started run's log is {out}/runs/<label>/main_ppo.log)")
    return read_evaluation(out)


def eval_overrides(args: argparse.Namespace, seed: int) -> list[str]:
    """An evaluation's ``--set``: the invocation's, and the rollout seed it samples with (the training
    seed of the runs it plays; the warm start is played once per training seed, each its own draw)."""
    return [*args.overrides, f"actor_rollout_ref.rollout.seed={seed}"]


def read_evaluation(out: Path) -> dict:
    """An evaluation's results.json, with ``outcomes``: label -> swapped ("0"/"1") -> test problem
    (its seed) -> the successes of its episodes (from episodes.jsonl): what paired comparisons read."""
    result = json.loads((out / "results.json").read_text())
    outcomes: dict[str, dict[str, dict[str, list[bool]]]] = {}
    with open(out / "episodes.jsonl", encoding="utf-8") as f:
        for line in f:
            record = json.loads(line)
            part = outcomes.setdefault(record["run"], {}).setdefault(str(int(bool(record.get("swapped")))), {})
            part.setdefault(str(record["seed"]), []).append(bool(record["success"]))
    return {**result, "outcomes": outcomes}


def warm_start(args: argparse.Namespace, method: str) -> dict:
    """worker group -> the model it starts from in ``method``'s recipe (with ``--set``), and adapter
    policy -> the adapter folder it starts from (L1), each with what built it (its ``warm_start.json``,
    None when absent) and the digest of its weights (``weights_sha256``)."""
    cfg = runs.compose(METHODS[method][0], args.overrides, Path(args.recipes))
    starts = {**runs.policy_models(cfg), **runs.adapter_starts(cfg)}
    metas = {name: Path(folder) / "warm_start.json" for name, folder in starts.items()}
    return {name: {"model": folder, "warm_start": json.loads(metas[name].read_text()) if metas[name].is_file() else None,
                   "sha256": weights_sha256(Path(folder))}
            for name, folder in starts.items()}


def warm_changes(saved: dict, now: dict) -> list[str]:
    """How two ``warm_start`` records differ, per policy: its folder, what built it, its weights."""
    changes = []
    for policy in sorted(saved.keys() | now.keys()):
        was, start = saved.get(policy) or {}, now.get(policy) or {}
        what = {"model": "folder", "warm_start": "record (warm_start.json)", "sha256": "weights"}
        differ = [what[key] for key in what if was.get(key) != start.get(key)]
        if differ:
            sha = f" (sha256 {str(was.get('sha256'))[:12]} -> {str(start.get('sha256'))[:12]})" if "weights" in differ else ""
            changes.append(f"{policy} {start.get('model', was.get('model'))}: its {', '.join(differ)}{sha}")
    return changes


def weights_sha256(folder: Path) -> str | None:
    """sha256 of the weight files of a model or adapter folder, None when it holds none: a warm start
    built again from the same record (on another machine, say) need not give the same weights."""
    digest, files = hashlib.sha256(), sorted(p for p in folder.glob("*") if p.suffix in (".safetensors", ".bin", ".pt") and p.is_file())
    for path in files:
        digest.update(path.name.encode() + b"\0")
        with open(path, "rb") as f:
            while chunk := f.read(1 << 24):
                digest.update(chunk)
    return digest.hexdigest() if files else None


def before_sources(methods: list[str], warm: dict) -> dict[str, str]:
    """method -> the method whose "before" evaluation stands for it. Untrained, a team whose roles
    all start from the shared policy's model is the shared team (same weights, same sampling; how a
    method groups its replies matters only in training): playing it again would cost a launch for the
    same distribution. A model per role started apart has its own."""
    def models(method: str) -> set[str]:
        return {start["model"] for start in warm[method].values()}

    def same_team(method: str) -> bool:
        return method in MAS_TEAMS and "mas" in methods and models(method) == models("mas")

    found = {method: "mas" if method != "mas" and same_team(method) else method for method in methods}
    for control, of in CONTROL_OF.items():  # untrained, a control is the team it controls for
        if found.get(control) == control and of in methods and models(control) == models(of):
            found[control] = found[of]
    return found


def alike_starts(warm: dict) -> set[str]:
    """The methods whose every policy starts from the same weights (``warm``: method -> ``warm_start``;
    a folder without weight files, by its path): swapped before training, such a team is the same team."""
    return {method for method, starts in warm.items() if len({start["sha256"] or start["model"] for start in starts.values()}) == 1}


def warm_names(starts: dict) -> dict:
    """A ``warm_start`` as reproduce.json names it: per policy, its folder's name and its weights' sha256."""
    return {policy: {"model": Path(start["model"]).name, "sha256": start.get("sha256")} for policy, start in starts.items()}


def last_step(checkpoints: Path, steps: int) -> Path | None:
    """A finished run's last step, to be played beside its best step on val; None when that is its best
    step (one evaluation stands for both) or when it is not kept (a run restored from --archive)."""
    last = checkpoints / f"global_step_{steps}"
    try:
        best = Path(runs.resolve_checkpoint(str(checkpoints), "best-val"))
    except runs.EvalError:
        return None
    if best.name == last.name:
        return None
    if not last.is_dir():
        evaluate.say(f"[after] {checkpoints.name}: its last step ({last.name}) is not kept (restored from --archive: its best step alone); "
                     "played at its best step on val only")
        return None
    return last


def declare_primary(out: Path, args: argparse.Namespace, source: str) -> dict | None:
    """The primary claim (``args.primary``) as declared in ``out/primary.json``: written now, before any
    evaluation after training exists, and read back as it was on a later invocation (from ``--archive``
    on a new machine: the declaration travels with the evaluations). Declaring one, or another, once an
    "after" exists here or in the archive is refused, naming those evaluations; so is dropping a declared one."""
    path = out / PRIMARY_FILE
    kept = Path(args.archive) / PRIMARY_FILE if args.archive else None
    saved = None
    for where in (path, kept):
        try:
            saved = json.loads(where.read_text()) if where is not None else None
        except FileNotFoundError:
            continue
        except ValueError as error:
            raise ReproduceError(f"{where}: unreadable ({error}); it declares this folder's primary claim: restore it, or use another --out") from None
        break
    if saved is not None and kept is not None:  # each place holds the declaration its evaluations were made under
        for where in (path, kept):
            if not where.is_file():
                where.parent.mkdir(parents=True, exist_ok=True)
                write_whole(where, json.dumps(saved, indent=1))
    if (saved or {}).get("claim") == args.primary and (saved or args.primary is None):
        return saved
    afters = sorted(str(p.parent) for folder in (out, *([Path(args.archive)] if args.archive else []))
                    for p in folder.glob("after/*/*/results.json"))
    if afters:
        what = (f"declare the primary claim {args.primary['a']}-{args.primary['b']}@{args.primary['split']}" if args.primary
                else "go on without a primary claim")
        was = f" (declared in {path} on {saved['declared_at']}: {saved['claim']})" if saved else ""
        raise ReproduceError(f"cannot {what} now{was}: evaluations after training exist ({', '.join(afters[:3])}"
                             f"{f' and {len(afters) - 3} more' if len(afters) > 3 else ''}); a primary claim is declared before "
                             f"any \"after\": give --primary as declared, or use another --out")
    if args.primary is None:
        for where in (path, kept):
            if where is not None:
                where.unlink(missing_ok=True)
        return None
    declared = {"claim": args.primary, "declared_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "methods": args.methods,
                "seeds": args.seeds, "splits": args.splits, "source_sha256": source}
    write_whole(path, json.dumps(declared, indent=1))
    if args.archive:
        Path(args.archive).mkdir(parents=True, exist_ok=True)
        write_whole(Path(args.archive) / PRIMARY_FILE, json.dumps(declared, indent=1))
    evaluate.say(f"[primary] declared in {path}: {args.primary['a']} - {args.primary['b']} on {args.primary['split']}, {args.primary['test']}")
    return declared


def source_hash() -> str:
    """sha256 of the package's code and recipes as installed: what an evaluation's numbers also depend on."""
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.suffix in (".py", ".yaml") and "__pycache__" not in p.parts):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def fingerprint(specs: list[str], args: argparse.Namespace, warm: dict, seed: int, split: str, source: str, problems: str,
                trained: dict[str, str | None] | None = None, swap: bool = True) -> dict:
    """What an evaluation of ``specs`` (``label=recipe[@checkpoints]``) depends on: the package's source
    (``source_hash``), each run's composed config as the evaluation plays it (flat keys, rollout seed and
    ``--set`` included), the problems (split, count, ``problems``: the sha256 of the split's tasks,
    ``check_splits``), each label's warm start (``warm``: label -> ``warm_start``) and, after training,
    each run's weights (``trained``: label -> ``trained_id``), and whether two-policy runs are also
    played swapped (``swap``)."""
    recipes = {spec.split("=", 1)[0]: spec.split("=", 1)[1].split("@", 1)[0] for spec in specs}
    return {"source": source, "split": split, "problems": problems, "episodes": args.episodes, "seed": seed,
            "configs": {label: flat_config(recipe, eval_overrides(args, seed), Path(args.recipes)) for label, recipe in recipes.items()},
            "warm": {label: warm[label] for label in recipes}, "trained": trained, "swap": swap}


def fingerprint_changes(saved: dict, now: dict) -> list[str]:
    """Why a saved "before" cannot stand for the one asked for now, in words (empty: it can)."""
    reasons = []
    if saved.get("source") != now["source"]:
        reasons.append(f"the package's source changed (sha256 {str(saved.get('source'))[:12]} -> {now['source'][:12]})")
    if saved.get("problems") != now["problems"]:
        reasons.append(f"the {now['split']} split holds other problems (sha256 {str(saved.get('problems'))[:12]} -> {now['problems'][:12]})")
    for key in ("split", "episodes", "seed"):
        if saved.get(key) != now[key]:
            reasons.append(f"{key}: {json.dumps(saved.get(key))} -> {json.dumps(now[key])}")
    # one that does not say was played swapped after training and not before (as this command played them then)
    if saved.get("swap", saved.get("trained") is not None) != now["swap"]:
        reasons.append("played swapped now" if now["swap"] else "played as trained alone now")
    saved_configs = saved.get("configs") or {}
    for label, config in now["configs"].items():
        changed = changed_keys(saved_configs[label], config) if label in saved_configs else ["not in it"]
        if changed:
            reasons.append(f"run {label}'s evaluation config: {'; '.join(changed[:3])}" + (f"; and {len(changed) - 3} more" if len(changed) > 3 else ""))
    if set(saved.get("warm") or {}) != set(now["warm"]):
        reasons.append(f"other runs (saved: {', '.join(sorted(saved.get('warm') or {})) or 'none'}; now: {', '.join(sorted(now['warm']))})")
    elif saved.get("warm") != now["warm"]:
        changes = [f"run {label}: {change}" for label in now["warm"] for change in warm_changes(saved["warm"][label], now["warm"][label])]
        reasons.append(f"another warm start ({'; '.join(changes)})")
    if now["trained"] is not None and (None in now["trained"].values() or saved.get("trained") != now["trained"]):
        reasons.append("other trained weights (a run trained again, or on to more steps, since)")
    return reasons


def earlier_evaluation(folder: Path, fp: dict) -> dict | None:
    """The evaluation saved in ``folder`` when it was made as ``fp`` says (``fingerprint``); otherwise
    None, having said which and why it is evaluated again."""
    kind = "after" if fp["trained"] is not None else "before"
    try:
        saved = json.loads((folder / "fingerprint.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(saved, dict):
        evaluate.say(f"[{kind}] {folder} evaluated again: its fingerprint.json is not a record")
        return None
    reasons = fingerprint_changes(saved, fp)
    if reasons:
        evaluate.say(f"[{kind}] {folder} evaluated again: {'; '.join(reasons)}")
        return None
    try:
        found = read_evaluation(folder)
    except (OSError, ValueError, KeyError):
        evaluate.say(f"[{kind}] {folder} evaluated again: its results are unreadable")
        return None
    weights = ", trained weights" if kind == "after" else ""
    evaluate.say(f"[{kind}] {folder}: same source, configs, problems and warm start{weights}: kept")
    return found


def evaluation(specs: list[str], args: argparse.Namespace, folder: Path, seed: int, split: str, fp: dict, swap: bool) -> dict:
    """``evaluate_runs`` into ``folder``, or the one saved there, or else in ``--archive``, when made alike
    (``earlier_evaluation``): a rerun of a reproduction cut short keeps its finished evaluations."""
    found = earlier_evaluation(folder, fp)
    kept = Path(args.archive) / folder.relative_to(args.out) if args.archive else None
    if found is None and kept is not None and (found := earlier_evaluation(kept, fp)) is not None:
        archive.restore_evaluation(kept, folder)
    if found is None:
        (folder / "fingerprint.json").unlink(missing_ok=True)  # written again once the evaluation is whole
        found = evaluate_runs(specs, args, folder, seed, split, swap=swap)
        write_whole(folder / "fingerprint.json", json.dumps(fp))
    if args.archive:
        archive.keep_evaluation(folder, Path(args.out), Path(args.archive))
    return found


def _role_rewards(row: dict | None) -> dict[str, float]:
    return {role: stats["reward_mean"] for role, stats in (row or {}).get("roles", {}).items()}


def _row_of(evaluation: dict | None, label: str, swapped: bool) -> dict | None:
    return next((r for r in (evaluation or {}).get("rows", []) if r["label"] == label and r["swapped"] == swapped), None)


def _outcomes_of(evaluations: list[tuple[dict, str]], swapped: bool) -> dict[str, list[bool]]:
    """test problem -> its successes over the given (evaluation, run label) pairs (one per seed)."""
    merged: dict[str, list[bool]] = {}
    for evaluation, label in evaluations:
        for problem, wins in evaluation.get("outcomes", {}).get(label, {}).get(str(int(swapped)), {}).items():
            merged.setdefault(problem, []).extend(wins)
    return merged


def _mean_roles(rows: list[dict]) -> dict[str, float]:
    per_seed = [_role_rewards(row) for row in rows]
    return {role: sum(r[role] for r in per_seed) / len(per_seed) for role in sorted(set().union(*per_seed)) if all(role in r for r in per_seed)}


def aggregate(before: dict, after: dict, methods: list[str], seeds: list[int], sources: dict[str, str] | None = None,
              failed: dict[str, str] | None = None, not_evaluated: dict[str, str] | None = None,
              alike: set[str] | frozenset = frozenset(), last_step: int | None = None) -> list[dict]:
    """One row per method (and per-role swapped), per split: test success before (the evaluations of
    ``sources[method]``, ``before_sources``; default its own: one per training seed, each sampled with
    that seed) and after (each seed's run at its best step on val; ``*_last``: at its last step,
    ``last_step``, played under the label ``<run>-last`` unless that is its best step), per seed and as a
    mean over seeds with its t interval (``stats.seed_interval``); the gain over before across runs
    (Welch's t, ``stats.seed_difference``) and paired over test problems (``stats.paired_problems``); per
    role its mean reward. A swapped row's "before" is the warm start swapped (for a method in ``alike``,
    whose policies start from the same weights, the warm start itself: swapped, it is the same team),
    and its ``swap_effect`` the difference in differences over the runs: (as trained - swapped) after,
    minus the same before, a paired t by run. A seed in ``failed`` (label -> why) is listed as failed and
    left out of every figure; one in ``not_evaluated`` (label -> why: trained, not yet played after
    training) likewise, listed as such.

    ``before``, ``after``: split -> seed -> an evaluation (``read_evaluation``)."""
    failed, not_evaluated = failed or {}, not_evaluated or {}
    left_out = {**failed, **not_evaluated}
    table = []
    for method in methods:
        source = (sources or {}).get(method, method)
        for swapped in ([False, True] if method in SWAPPED else [False]):
            labels = {seed: run_label(method, seed) for seed in seeds}
            row = {"method": method, "recipe": METHODS[method][0], "name": METHODS[method][1] + (", policies swapped" if swapped else ""),
                   "swapped": swapped, "failed_seeds": {s: failed[label] for s, label in labels.items() if label in failed},
                   "not_evaluated_seeds": {s: not_evaluated[label] for s, label in labels.items() if label in not_evaluated}, "splits": {}}
            for split in after.keys() | before.keys():
                starts = {s: r for s in seeds if (r := _before_row(before.get(split, {}).get(s), source, swapped, method in alike)) is not None}
                ends = {s: r for s in seeds if labels[s] not in left_out and (r := _row_of(after.get(split, {}).get(s), labels[s], swapped)) is not None}
                lasts = {s: r for s in ends if (r := _last_row(after[split][s], labels[s], swapped, ends[s], last_step)) is not None}
                b = [r["success"] for r in starts.values()]
                b_out = _outcomes_of([(before[split][s], source) for s in starts], swapped and method not in alike)
                part = {"before_per_seed": {s: r["success"] for s, r in starts.items()}, "before": stats.seed_interval(b),
                        "before_mean": sum(b) / len(b) if b else None, "before_swapped_is_as_trained": swapped and method in alike,
                        "role_reward_before": _mean_roles(list(starts.values()))}
                for name, runs_ in (("after", ends), ("after_last", lasts)):
                    a = [r["success"] for r in runs_.values()]
                    a_out = _outcomes_of([(after[split][s], r["label"]) for s, r in runs_.items()], swapped)
                    gain = "gain" if name == "after" else "gain_last"
                    part.update({f"{name}_per_seed": {s: r["success"] for s, r in runs_.items()}, name: stats.seed_interval(a),
                                 f"{name}_mean": sum(a) / len(a) if a else None, gain: stats.seed_difference(a, b),
                                 f"{gain}_paired": stats.paired_problems(a_out, b_out)})
                    if name == "after":
                        part.update({"after_min": min(a, default=None), "after_max": max(a, default=None),
                                     "outcomes": a_out})  # for comparisons between methods; not written to reproduce.json
                part.update({
                    "after_step_per_seed": {s: r.get("step") for s, r in ends.items()},
                    "episodes_per_seed": {s: r["episodes"] for s, r in ends.items()},
                    # one evaluation's own noise (binomial): a description of it, not of another training run
                    "after_binomial_se_per_seed": {s: binomial_se(r["success"], r["episodes"]) for s, r in ends.items()},
                    "role_reward_after": _mean_roles(list(ends.values())),
                })
                row["splits"][split] = part
            table.append(row)
    for row in table:  # the swap's effect: what training added to the cost of swapping, run by run
        trained = next((r for r in table if r["method"] == row["method"] and not r["swapped"]), None) if row["swapped"] else None
        for split, part in row["splits"].items():
            part["swap_effect"] = None if trained is None else swap_effect(trained["splits"][split], part)
    return table


def _before_row(evaluation: dict | None, source: str, swapped: bool, alike: bool) -> dict | None:
    """A method's warm start as ``aggregate`` reads it: swapped where asked, unless its policies start alike (the same team)."""
    return _row_of(evaluation, source, swapped and not alike)


def _last_row(evaluation: dict, label: str, swapped: bool, best: dict, last_step: int | None) -> dict | None:
    """A run at its last step: its ``LAST`` evaluation, or its best-on-val one when that is its last step."""
    found = _row_of(evaluation, label + LAST, swapped)
    if found is None and last_step is not None and best.get("step") == last_step:
        return best
    return found


def swap_effect(trained: dict, swapped: dict) -> dict | None:
    """(as trained - swapped) after training minus (as trained - swapped) before it, per run, with a
    paired t over the runs that have all four figures (``stats.seed_difference``); None under two runs."""
    seeds = sorted(trained["after_per_seed"].keys() & swapped["after_per_seed"].keys()
                   & trained["before_per_seed"].keys() & swapped["before_per_seed"].keys())
    after = [trained["after_per_seed"][s] - swapped["after_per_seed"][s] for s in seeds]
    before = [trained["before_per_seed"][s] - swapped["before_per_seed"][s] for s in seeds]
    found = stats.seed_difference(after, before, paired=True)
    return None if found is None else {**found, "after": sum(after) / len(after), "before": sum(before) / len(before)}


# (a, b): the after-training comparisons the reproduction reports, by method (and swapped)
COMPARISONS = [(("per_role", False), ("control", False)), (("mas", False), ("sa", False)), (("per_role", False), ("sa", False)),
               (("mas", False), ("mas_by_problem", False)), (("per_role", False), ("mas", False)), (("per_role", True), ("per_role", False)),
               (("real", True), ("real", False)), (("program", False), ("mas", False)), (("per_role_async", False), ("per_role", False))]


def comparisons(table: list[dict], primary: dict | None = None) -> list[dict]:
    """After training, per split, each pair of ``COMPARISONS`` present in ``table`` (and the ``primary``
    claim's, marked ``primary``): a - b across training runs (Welch's t over the seeds' figures) and
    paired over the test problems both played."""
    rows = {(row["method"], row["swapped"]): row for row in table}
    pairs = list(COMPARISONS)
    if primary and ((primary["a"], False), (primary["b"], False)) not in pairs:
        pairs.insert(0, ((primary["a"], False), (primary["b"], False)))
    found = []
    for a, b in pairs:
        if a not in rows or b not in rows:
            continue
        for split in sorted(rows[a]["splits"].keys() & rows[b]["splits"].keys(), key=split_order):
            x, y = rows[a]["splits"][split], rows[b]["splits"][split]
            if x["after_per_seed"] and y["after_per_seed"]:
                if a[0] == b[0]:  # the same runs, swapped and not: paired by seed
                    seeds = sorted(x["after_per_seed"].keys() & y["after_per_seed"].keys())
                    over_seeds = stats.seed_difference([x["after_per_seed"][s] for s in seeds], [y["after_per_seed"][s] for s in seeds], paired=True)
                else:
                    over_seeds = stats.seed_difference(list(x["after_per_seed"].values()), list(y["after_per_seed"].values()))
                found.append({"split": split, "a": rows[a]["name"], "b": rows[b]["name"], "seeds": over_seeds,
                              "paired": stats.paired_problems(x["outcomes"], y["outcomes"]),
                              "primary": bool(primary) and (a, b, split) == ((primary["a"], False), (primary["b"], False), primary["split"])})
    return found


def secondary_tests(table: list[dict], found: list[dict]) -> list[dict]:
    """Every test over training runs the tables report besides the primary claim, as the dicts that
    hold its ``p``: each method's gain over its warm start (best step and last), each swap's effect and
    each comparison between methods. They form the family Holm's adjustment is made over."""
    family = [part[key] for row in table for part in row["splits"].values()
              for key in ("gain", "gain_last", "swap_effect") if part.get(key)
              and not (key == "gain_last" and part["after_last_per_seed"] == part["after_per_seed"])]  # every run's last step its best: one test
    return family + [c["seeds"] for c in found if c["seeds"] and not c["primary"]]


def adjust(table: list[dict], found: list[dict]) -> int:
    """Holm-adjust the secondary tests in place (``p_holm`` beside each ``p``); returns the family's size."""
    family = secondary_tests(table, found)
    for test, adjusted in zip(family, stats.holm([test["p"] for test in family])):
        test["p_holm"] = adjusted
    return sum(test["p"] is not None for test in family)


def collapses(curve: Path) -> dict | None:
    """A run's steps without a gradient (``actor/grad_norm`` 0: every group of the step gave its replies one
    reward), from its curve: how many, the longest streak, and whether it reaches ``COLLAPSE_STEPS``."""
    try:
        steps = [json.loads(line) for line in curve.read_text().splitlines() if line.strip()]
        flat = [float(step["data"]["actor/grad_norm"]) == 0.0 for step in sorted(steps, key=lambda step: step["step"])
                if "actor/grad_norm" in step.get("data", {})]  # a validation-only record has none
    except (OSError, ValueError, KeyError, TypeError):
        return None
    streak = stats.longest_run(flat)
    return {"steps": len(flat), "without_gradient": sum(flat), "longest": streak, "collapsed": streak >= COLLAPSE_STEPS}


def split_order(split: str) -> tuple[int, str]:
    return (SPLITS.index(split) if split in SPLITS else len(SPLITS), split)


def public(table: list[dict]) -> list[dict]:
    """The table as reproduce.json holds it: without the per-problem outcomes."""
    return [{**row, "splits": {split: {k: v for k, v in part.items() if k != "outcomes"} for split, part in row["splits"].items()}}
            for row in table]


def _interval_text(interval: dict | None, values: list[float]) -> str:
    if interval is not None and interval["alike"]:
        return f"{interval['mean']:.3f} (all {interval['runs']} alike: no interval)"
    if interval is not None:
        return f"{interval['mean']:.3f} [{interval['low']:.3f}, {interval['high']:.3f}]"
    return f"{values[0]:.3f} (one run)" if values else "-"


def _p_text(p: float | None, bootstrap: bool) -> str:
    if p is None:
        return ""
    if bootstrap and p == 0:  # no resample on the other side of zero: below 2/B, not 0
        return f", p < {2 / stats.BOOTSTRAP_RESAMPLES:g}"
    return f", p = {p:.3f}" if p >= 0.001 else f", p = {p:.1e}" if p > 0 else ", p < 1e-300"


def _gain_text(gain: dict | None) -> str:
    """A difference over seeds (``stats.seed_difference``) or paired over problems (``stats.paired_problems``)."""
    if gain is None:
        return "n/a (needs 2+ runs a side)"
    bootstrap = "problems" in gain
    if gain["low"] == gain["high"]:
        return f"{gain['diff']:+.3f} (every {'problem' if bootstrap else 'run'} moved alike: no interval)"
    text = f"{gain['diff']:+.3f} [{gain['low']:+.3f}, {gain['high']:+.3f}]{_p_text(gain['p'], bootstrap)}"
    if gain.get("p_holm") is not None:
        text += f" (Holm {gain['p_holm']:.3f})" if gain["p_holm"] >= 0.001 else f" (Holm {gain['p_holm']:.1e})"
    return text + (f", on the {gain['problems']} problems both played" if bootstrap and gain["unshared"] else "")


def markdown(table: list[dict], meta: dict) -> str:
    fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
    seeds = meta["seeds"]
    level = f"{stats.LEVEL:.0%}"
    lines = [
        "# Reproduction: Plan-Path 4x4 in one turn (routes of 2-3 moves), models warm-started on noisy demonstrations",
        "",
        f"Test success (share of {meta['episodes'] or '-'} problems solved, sampled at T = 1) before training (the warm start, "
        f"evaluated once per training seed with that seed's sampling) and after {meta['steps']} steps (each run's best step on "
        f"val; its last step in the second table), training seeds {', '.join(map(str, seeds))}. After: the mean over training runs with its {level} t interval "
        "from the variance between runs (seeds - 1 degrees of freedom); before: the mean of the warm start's evaluations "
        "with the same interval, whose spread is evaluation noise alone (one warm start). Gain over seeds: after - before, "
        f"Welch's t over the two sets ({level} interval, two-sided p). Gain paired over problems: the same problems before and after, "
        f"each problem's success averaged over seeds, with a {level} bootstrap interval over problems (p: the share of "
        f"{stats.BOOTSTRAP_RESAMPLES} resamples on the other side of zero, two-sided). " +
        (f"Written again (`--report`) from saved evaluations, all made by the package's source sha256 "
         f"{meta['source_sha256'][:12]}." if meta.get("report") else
         f"This invocation took {meta['wall_s'] / 60:.0f} min, not counting the warm start and data made before it "
         "(`make reproduce` makes both) nor evaluations and training runs kept from an earlier invocation."),
    ]
    if len(seeds) < 2:
        lines += ["", "**One training seed**: the variance between training runs cannot be estimated, so no interval over "
                  "seeds and no gain over seeds is given, and no claim about training runs is made; the paired figures "
                  "describe this one run on these problems."]
    lines += ["", *primary_text(meta)]
    if meta.get("family"):
        lines += ["", f"**Secondary tests** (every other p over training runs below, {meta['family']} of them): each p is given with "
                  "its Holm adjustment over that family (`Holm`), which is the one to read for a claim; a paired p over problems "
                  "describes the runs made, not another set of runs, and is not adjusted."]
    for split in sorted({split for row in table for split in row["splits"]}, key=split_order):
        what = SPLIT_NAMES.get(split, split)
        lines += ["", f"## {what} (`{split}`{', sha256 ' + meta['split_sha256'][split][:16] if split in meta.get('split_sha256', {}) else ''})", "",
                  "| method | before | after | gain over seeds | gain paired over problems | " + " | ".join(f"seed {s}" for s in seeds)
                  + " | role reward: before -> after (mean) |",
                  "|---|---|---|---|---|" + "---|" * len(seeds) + "---|"]
        for row in table:
            part = row["splits"].get(split)
            if part is None:
                continue
            roles = ", ".join(f"{role} {fmt(part['role_reward_before'].get(role))} -> {fmt(reward)}" for role, reward in part["role_reward_after"].items())
            before = _interval_text(part["before"], list(part["before_per_seed"].values()))
            after = _interval_text(part["after"], list(part["after_per_seed"].values()))
            cells = ["left out" if s in row["failed_seeds"] or s in row["not_evaluated_seeds"] else fmt(part["after_per_seed"].get(s)) for s in seeds]
            line = [row["name"], before, after, _gain_text(part["gain"]), _gain_text(part["gain_paired"]), *cells, roles or "-"]
            lines.append("| " + " | ".join(line) + " |")
        lines += ["", f"At each run's last step ({meta['steps']}), {what.lower()}:", "",
                  "| method | after, last step | gain over seeds | gain paired over problems | " + " | ".join(f"seed {s}" for s in seeds) + " |",
                  "|---|---|---|---|" + "---|" * len(seeds)]
        for row in table:
            if (part := row["splits"].get(split)) is not None:
                cells = [fmt(part["after_last_per_seed"].get(s)) for s in seeds]
                lines.append("| " + " | ".join([row["name"], _interval_text(part["after_last"], list(part["after_last_per_seed"].values())),
                                                 _gain_text(part["gain_last"]), _gain_text(part["gain_last_paired"]), *cells]) + " |")
        swaps = [(row, part) for row in table if row["swapped"] and (part := row["splits"].get(split)) is not None]
        if swaps:
            lines += ["", "The swap's effect, (as trained - swapped) after training minus the same before it, run by run "
                      f"({stats.PAIRED_T}): what training added to the cost of swapping. A swapped warm start that costs as much "
                      "as the trained swap says the warm start, not training, made the roles apart.", ""]
            for row, part in swaps:
                effect = part["swap_effect"]
                same = " (the warm start gives both policies the same weights: swapped, it is the same team, so before = 0)" \
                    if part["before_swapped_is_as_trained"] else ""
                lines.append(f"- {row['name']}: " + ("n/a (needs 2+ runs with all four figures)" if effect is None else
                             f"after {effect['after']:+.3f}, before {effect['before']:+.3f}{same}: {_gain_text(effect)}"))
        lines += ["", f"After training on {what.lower()}, a - b (over seeds: {stats.WELCH} between methods, a {stats.PAIRED_T} "
                  "for one method's policies swapped; paired: over problems):", ""]
        lines += [f"- {c['a']} - {c['b']}: over seeds{' (' + c['seeds']['test'] + ')' if c['seeds'] else ''} {_gain_text(c['seeds'])}; "
                  f"paired {_gain_text(c['paired'])}"
                  for c in meta.get("comparisons", []) if c["split"] == split] or ["- (no pair of methods ran)"]
        noise = next(((part["episodes_per_seed"][s], part["after_binomial_se_per_seed"][s]) for row in table
                      if (part := row["splits"].get(split)) for s in part["episodes_per_seed"]), None)
        if noise:
            lines += ["", f"One evaluation's own noise (binomial, {noise[0]} episodes): about ±{noise[1]:.3f} on a success rate, "
                      "a description of that evaluation alone; a claim about training rests on the intervals over seeds."]
    lines += ["", "Role reward: the mean reward of a role's replies in the test episodes (`before/` and `after/`).",
              "", "Warm starts (sha256 of their weights; verl's SFT gives other bits on another machine, so \"before\" is measured "
              "per run and a rerun elsewhere compares gains, not levels): "
              + "; ".join(f"{METHODS[method][1]}: " + ", ".join(_warm_text(policy, start) for policy, start in policies.items())
                          for method, policies in meta["warm_starts"].items()) + "."]
    timed = {m: [t for t in per_seed.values() if t is not None] for m, per_seed in meta.get("train_wall_s", {}).items()}
    if any(timed.values()):
        lines += ["", "Training time per method (its runs' main_ppo launches, summed; --jobs at once): " + "; ".join(
            f"{METHODS[m][1]} {sum(times) / 60:.0f} min over {len(times)} runs" for m, times in timed.items() if times) + "."]
    if meta.get("collapses"):
        lines += ["", f"Collapsed runs ({COLLAPSE_STEPS} training steps in a row or more without a gradient: every group of each "
                  "step gave its replies one reward): " + "; ".join(
                      f"{METHODS[method][1]} {sum(bool(c and c['collapsed']) for c in runs_.values())} of {sum(c is not None for c in runs_.values())}"
                      + "".join(f" (seed {seed}: {c['without_gradient']} of {c['steps']} steps without, {c['longest']} in a row)"
                                for seed, c in runs_.items() if c and c["collapsed"])
                      for method, runs_ in meta["collapses"].items()) + "."]
    for method, source in meta.get("before_of", {}).items():
        why = ("untrained, a control is the team it controls for" if method in CONTROL_OF
               else "every role from the same model")
        lines += ["", f"Before training, {METHODS[method][1]} is the team of {METHODS[source][1]} ({why}): "
                  "one evaluation stands for both."]
    for row in table:
        for seed, why in sorted({**row["failed_seeds"], **row["not_evaluated_seeds"]}.items()):
            if not row["swapped"]:
                lines += ["", f"**{row['name']}, seed {seed}: left out of the figures**: {why}"]
    return "\n".join(lines) + "\n"


def _warm_text(policy: str, start) -> str:
    if isinstance(start, dict):  # {"model": folder name, "sha256": ...}
        return f"{policy} `{start['model']}` ({str(start.get('sha256'))[:12]})"
    return f"{policy} `{start}`"


def primary_text(meta: dict) -> list[str]:
    """The primary claim as declared (before any "after" existed) and what its test gave."""
    declared = meta.get("primary")
    if not declared:
        return ["**No primary claim was declared**: every test below is secondary, Holm-adjusted over the family."]
    claim = declared["claim"]
    head = (f"**Primary claim** (declared {declared['declared_at']}, before any evaluation after training existed): "
            f"{METHODS[claim['a']][1]} minus {METHODS[claim['b']][1]}, {claim['statistic']}, on the "
            f"{SPLIT_NAMES.get(claim['split'], claim['split']).lower()} (`{claim['split']}`); {claim['test']}, alpha {claim['alpha']}.")
    result = meta.get("primary_result")
    if result is None or result["seeds"] is None:
        return [head, "", "Its test: not made (needs 2+ finished runs of each method on that split)."]
    test = result["seeds"]
    holds = test["p"] is not None and test["p"] < claim["alpha"] and test["diff"] > 0
    return [head, "", f"Its test over {test['runs'][0]} and {test['runs'][1]} runs: {_gain_text(test)}: "
            + ("**it holds**." if holds else "**it does not hold** at that level.")]


def plot_table(table: list[dict], out: Path) -> str:
    """``reproduce.png``: test success per method before and after training (mean over seeds, min-max bar)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    labelled = set()

    def label(text: str) -> str | None:  # each legend entry once
        return None if text in labelled or labelled.add(text) else text

    split = min((split for row in table for split in row["splits"]), key=split_order, default=None)
    for i, row in enumerate(table):
        part = row["splits"].get(split) or {}
        if part.get("before_mean") is not None:
            spread = [[part["before_mean"] - min(part["before_per_seed"].values())], [max(part["before_per_seed"].values()) - part["before_mean"]]]
            ax.bar(i - 0.2, part["before_mean"], 0.4, yerr=spread, capsize=4, color="lightgrey", label=label("before (warm start; mean, min-max over seeds)"))
        if part.get("after_mean") is not None:
            spread = [[part["after_mean"] - part["after_min"]], [part["after_max"] - part["after_mean"]]]
            ax.bar(i + 0.2, part["after_mean"], 0.4, yerr=spread, capsize=4, color="tab:red" if row["swapped"] else "tab:blue",
                   label=label("after, swapped" if row["swapped"] else "after (mean, min-max over seeds)"))
    ax.set_xticks(range(len(table)), [row["name"].replace(", ", ",\n", 1) for row in table], fontsize=8)
    ax.set_ylabel(f"success on the {split} split")
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / "reproduce.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def check_splits(args: argparse.Namespace) -> dict[str, str]:
    """split -> sha256 of its problems, for the splits asked for; a missing split names the command
    that writes it, and a confirmation split (``CONFIRMATIONS``) that shares problems with any other
    split, evaluated or not, is refused."""
    cfg = runs.compose(METHODS[args.methods[0]][0], args.overrides, Path(args.recipes))
    confirmations = [split for split in args.splits if split in CONFIRMATIONS]
    files = {split: runs.split_file(cfg, split) for split in dict.fromkeys(("train", "val", *args.splits))}
    # a confirmation split is checked against every other split: test and the other confirmation split too where they exist
    folder = Path(files["train"]).parent
    files.update({split: str(folder / f"{split}.parquet") for split in ("test", *CONFIRMATIONS)
                  if confirmations and split not in files and (folder / f"{split}.parquet").is_file()})
    tasks = {split: [task_key(json.loads(info["task_json"])) for info in pd.read_parquet(path, columns=["extra_info"])["extra_info"]]
             for split, path in files.items()}
    for confirm in confirmations:
        shared = {split: len(set(tasks[confirm]) & set(tasks[split])) for split in tasks if split != confirm}
        if any(shared.values()):
            raise ReproduceError(f"the confirmation split {files[confirm]} shares problems with "
                                 + ", ".join(f"{split} ({n})" for split, n in shared.items() if n)
                                 + ": it must be disjoint from every other split; write it again with the data "
                                 f"command of the recipe's data section (--{confirm}: a seed range of its own)")
    return {split: hashlib.sha256("\n".join(tasks[split]).encode()).hexdigest() for split in args.splits}


def saved_evaluations(args: argparse.Namespace, saved: Path) -> tuple[dict, dict, dict[str, str], dict[str, str], dict]:
    """``--report``: the evaluations saved in ``saved`` (``before/`` and ``after/``, per split and seed, as
    ``main`` or an ``--archive`` leaves them) with what ``aggregate`` and ``markdown`` need, read from
    their fingerprints: (before, after, sources, failed, meta). Every "before" must be there; a seed with
    no "after" on any split had its runs fail (as ``main`` leaves it), and so has a run an "after" does
    not hold. Refused, naming the folders: an evaluation missing or unreadable, a seed's "after" on some
    splits only, and evaluations made by different code, or of one split on other problems or counts."""
    before: dict[str, dict[int, dict]] = {}
    after: dict[str, dict[int, dict]] = {}
    prints: dict[Path, dict] = {}
    no_after = {seed for seed in args.seeds if not any((saved / "after" / split / f"s{seed}").exists() for split in args.splits)}
    for kind, found in (("before", before), ("after", after)):
        for split in args.splits:
            for seed in args.seeds:
                folder = saved / kind / split / f"s{seed}"
                if kind == "after" and seed in no_after:
                    continue
                try:
                    prints[folder] = json.loads((folder / "fingerprint.json").read_text())
                    found.setdefault(split, {})[seed] = read_evaluation(folder)
                except (OSError, ValueError, KeyError) as error:
                    raise ReproduceError(f"{folder}: no finished evaluation there ({error.__class__.__name__}); "
                                         "run without --report to play it") from None
    for key, what in (("source", "by different code (the package's source sha256)"), ("problems", "on other problems (sha256)"),
                      ("episodes", "with other problem counts (--episodes)")):
        for split in [None] if key == "source" else args.splits:
            values: dict[str, list[str]] = {}
            for folder, fp in prints.items():
                if split is None or folder.parent.name == split:
                    values.setdefault(str(fp.get(key)), []).append(str(folder.relative_to(saved)))
            if len(values) > 1:
                raise ReproduceError(f"the evaluations in {saved} were made {what}: "
                                     + "; ".join(f"{value[:12]}: {', '.join(folders)}" for value, folders in values.items()))
    warm: dict[str, dict] = {}  # method or run label -> its warm start, as its evaluations recorded it
    for fp in prints.values():
        warm.update(fp.get("warm") or {})
    sources = {}
    for method in args.methods:
        played = [m for m in (method, *([CONTROL_OF[method]] if method in CONTROL_OF else []), "mas") if m in warm]
        if not played:
            raise ReproduceError(f"{saved}/before: no evaluation of {method} (nor of the shared team) before training")
        sources[method] = played[0]
    failed, not_evaluated = {}, {}
    for seed in args.seeds:
        for method in args.methods:
            label = run_label(method, seed)
            missing = [saved / "after" / split / f"s{seed}" for split in args.splits
                       if seed in no_after or label not in prints[saved / "after" / split / f"s{seed}"].get("configs", {})]
            if not missing:
                continue
            where = ", ".join(map(str, missing))
            if (saved / "checkpoints" / label / "trained.json").is_file():
                not_evaluated[label] = f"trained, not evaluated after training: no evaluation in {where} (run without --report to play it)"
            else:
                failed[label] = f"no evaluation of it after training in {where} (its training run failed or did not finish)"
    labels = [run_label(m, s) for m in args.methods for s in args.seeds]
    try:
        trained = {label: json.loads((saved / "checkpoints" / label / "trained.json").read_text())["steps"] for label in labels
                   if (saved / "checkpoints" / label / "trained.json").is_file()}
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ReproduceError(f"{saved}/checkpoints: a trained.json is not a record ({error!r}); say --steps") from None
    if not (args.steps or trained):
        raise ReproduceError(f"{saved}/checkpoints: no trained.json of the runs asked for tells their steps; say --steps")
    other = {label: steps for label, steps in trained.items() if steps != (args.steps or max(trained.values()))}
    if other:  # one table, one training length
        raise ReproduceError(f"{saved}/checkpoints: runs trained for other steps than " + (f"--steps {args.steps}" if args.steps else
                             f"the others' {max(trained.values())}") + ": " + ", ".join(f"{label} {steps}" for label, steps in sorted(other.items())))
    starts = {m: next(warm[label] for label in [*(run_label(m, s) for s in args.seeds), sources[m]] if label in warm) for m in args.methods}
    try:
        primary = json.loads((saved / PRIMARY_FILE).read_text())
    except FileNotFoundError:
        primary = None
    except ValueError as error:
        raise ReproduceError(f"{saved / PRIMARY_FILE}: unreadable ({error})") from None
    meta = {"steps": args.steps or max(trained.values()), "not_evaluated": not_evaluated, "source_sha256": next(iter(prints.values()))["source"],
            "report": True,
            "split_sha256": {split: prints[saved / "before" / split / f"s{args.seeds[0]}"]["problems"] for split in args.splits},
            "warm_starts": {m: warm_names(start) for m, start in starts.items()}, "alike": sorted(alike_starts(starts)), "primary": primary}
    return before, after, sources, failed, meta


def curve_file(out: Path, label: str) -> Path:
    """A run's learning curve: its training log, or where an archive keeps it (``checkpoints/<run>/curve.jsonl``)."""
    log, kept = out / "logs" / f"{label}.jsonl", out / "checkpoints" / label / "curve.jsonl"
    return kept if not log.is_file() and kept.is_file() else log


def write_table(out: Path, args: argparse.Namespace, before: dict, after: dict, sources: dict[str, str], failed: dict[str, str],
                meta: dict, curves: Path | None = None) -> None:
    """reproduce.json, reproduce.md, reproduce.png and the learning curves (the runs' in ``curves``,
    default ``out``: ``logs/``, or an archive's ``checkpoints/<run>/curve.jsonl``), and the table printed.
    A run in ``failed`` or ``meta["not_evaluated"]`` is left out of the figures; the latter's curve is drawn."""
    not_evaluated = meta.get("not_evaluated", {})
    table = aggregate(before, after, args.methods, args.seeds, sources, failed, not_evaluated, set(meta.get("alike", [])), meta["steps"])
    episodes = next((r["episodes"] for split in after.values() for ev in split.values() for r in ev["rows"]), None)
    claim = (meta.get("primary") or {}).get("claim")
    found = comparisons(table, claim)
    family = adjust(table, found)
    curve_of = {label: curve_file(curves or out, label) for label in (run_label(m, s) for m in args.methods for s in args.seeds)}
    meta = {**meta, "seeds": args.seeds, "splits": args.splits, "episodes": episodes,
            "before_of": {m: source_of for m, source_of in sources.items() if source_of != m}, "comparisons": found, "failed": failed,
            "not_evaluated": not_evaluated, "family": family, "primary_result": next((c for c in found if c["primary"]), None),
            "collapses": {m: {s: collapses(curve_of[run_label(m, s)]) for s in args.seeds} for m in args.methods},
            "train_wall_s": {m: {s: sum(t) if (t := launch_times((curves or out) / "checkpoints" / run_label(m, s))) else None
                                 for s in args.seeds} for m in args.methods}}
    (out / "reproduce.json").write_text(json.dumps({**meta, "rows": public(table)}, indent=1))
    (out / "reproduce.md").write_text(markdown(table, meta))
    drawn = [label for label, curve in curve_of.items() if label not in failed and (label not in not_evaluated or curve.is_file())]
    logs = {m: [str(curve_of[run_label(m, s)]) for s in args.seeds if run_label(m, s) in drawn] for m in args.methods}
    curve_args = [f"--curves={m}=" + ",".join(files) for m, files in logs.items() if files]
    if plots.main([*curve_args, "--out", str(out)]) != 0:
        print("reproduce: the learning curves could not be drawn (see above); the table is written", file=sys.stderr)
    plot_table(table, out)
    print(markdown(table, meta))
    print(f"wrote {out}/reproduce.md, reproduce.json, reproduce.png, learning_curves.png")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # composing a recipe imports verl, which warns once per optional engine it lacks (megatron, ...)
    warnings.filterwarnings("ignore", message=r".* engine is not available", category=UserWarning)
    started = time.perf_counter()
    out = Path(args.out)
    if args.report:
        saved = Path(args.archive) if args.archive else out
        try:
            before, after, sources, failed, meta = saved_evaluations(args, saved)
        except ReproduceError as error:
            print(f"reproduce: {error}", file=sys.stderr)
            return 1
        out.mkdir(parents=True, exist_ok=True)
        write_table(out, args, before, after, sources, failed, meta, curves=saved)
        return 0
    out.mkdir(parents=True, exist_ok=True)
    try:
        steps = args.steps or int(runs.compose(METHODS[args.methods[0]][0], args.overrides, Path(args.recipes)).trainer.total_training_steps)
        warm = {method: warm_start(args, method) for method in args.methods}  # composes recipes: Hydra's global state is for one thread
        settings = {method: training_settings(method, args) for method in args.methods}
        source = source_hash()
        if args.archive:
            keep_warm_starts(warm, args)
        for method in args.methods:  # said (or refused) before the "before" evaluation, not an hour into it
            for seed in args.seeds:
                checkpoints = out / "checkpoints" / run_label(method, seed)
                if args.archive:
                    restore_run(checkpoints, steps, warm[method], settings[method], source, args, out)
                reasons = stale(checkpoints, warm[method], settings[method], source)
                check_saved(checkpoints, steps, reasons)
                if reasons:
                    evaluate.say(f"[train {run_label(method, seed)}] saved, but will be trained again: {'; '.join(reasons)}")
        split_sha256 = check_splits(args)
        primary = declare_primary(out, args, source)
        # each method's recipe at its warm start, once per distinct team (a model per role may start its roles apart: --set),
        # once per training seed (each its own draw) and split; kept from an earlier invocation only if made alike
        sources = before_sources(args.methods, warm)
        before_specs = [f"{name}={METHODS[name][0]}" for name in args.methods if sources[name] == name]
        alike = alike_starts(warm)
        # a team whose policies start apart also plays its warm start swapped: what swapping costs before training
        swap_before = any(sources[name] == name and name in SWAPPED and name not in alike for name in args.methods)
        before: dict[str, dict[int, dict]] = {}
        for split in args.splits:
            for seed in args.seeds:
                fp = fingerprint(before_specs, args, warm, seed, split, source, split_sha256[split], swap=swap_before)
                before.setdefault(split, {})[seed] = evaluation(before_specs, args, out / "before" / split / f"s{seed}", seed, split, fp,
                                                                swap=swap_before)
        failed = train_all(steps, args, out, warm, settings)
        after: dict[str, dict[int, dict]] = {}
        for split in args.splits:
            for seed in args.seeds:
                labels = {run_label(m, seed): m for m in args.methods if run_label(m, seed) not in failed}
                if not labels:
                    continue
                played = {}  # evaluation label -> (method, checkpoint): each run at its best step on val, and at its last
                for label, m in labels.items():
                    played[label] = (m, out / "checkpoints" / label)
                    if (last := last_step(out / "checkpoints" / label, steps)) is not None:
                        played[label + LAST] = (m, last)
                specs = [f"{label}={METHODS[m][0]}@{checkpoint}" for label, (m, checkpoint) in played.items()]
                fp = fingerprint(specs, args, {label: warm[m] for label, (m, _) in played.items()}, seed, split, source, split_sha256[split],
                                 trained={label: trained_id(out / "checkpoints" / label) for label in labels})
                after.setdefault(split, {})[seed] = evaluation(specs, args, out / "after" / split / f"s{seed}", seed, split, fp, swap=True)
    except (ReproduceError, runs.EvalError) as error:
        print(f"reproduce: {error}", file=sys.stderr)
        return 1
    meta = {"steps": steps, "wall_s": time.perf_counter() - started, "overrides": args.overrides, "source_sha256": source,
            "split_sha256": split_sha256, "warm_starts": {m: warm_names(warm[m]) for m in args.methods}, "alike": sorted(alike),
            "primary": primary}
    write_table(out, args, before, after, sources, failed, meta)
    if failed:
        print(f"reproduce: {len(failed)} training run(s) failed and are reported as failed: {', '.join(sorted(failed))} "
              "(run the same command again to retry them; finished runs are kept)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
