"""The training runs: one per method and seed through ``main_ppo``, resumed or kept where nothing they were made from changed."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path


from pettingllms_verl.checkpoints import TRACKER, step_folder
from pettingllms_verl.eval import evaluate
from pettingllms_verl.eval import archive, runs
from pettingllms_verl.rollout import faults
from pettingllms_verl.files import write_whole
from pettingllms_verl.eval.reproduce.fingerprints import changed_keys, source_hash, training_settings, warm_changes
from pettingllms_verl.eval.reproduce.methods import METHODS, ReproduceError, TrainingFailed, run_label


def finished_steps(checkpoints: Path) -> int:
    """The last step a run saved whole (verl writes this file last), 0 when none."""
    try:
        return int((checkpoints / TRACKER).read_text().strip())
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
    last = Path(step_folder(checkpoints, done))
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


def last_step(checkpoints: Path, steps: int) -> Path | None:
    """A finished run's last step, to be played beside its best step on val; None when that is its best
    step (one evaluation stands for both) or when it is not kept (a run restored from --archive)."""
    last = Path(step_folder(checkpoints, steps))
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
