"""What an evaluation or a training run was made from (warm starts by their weights' sha256, the
package's source, the composed config), and what changed since."""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

from omegaconf import OmegaConf

from pettingllms_verl.eval import evaluate
from pettingllms_verl.eval import archive, runs
from pettingllms_verl.eval.reproduce.methods import CONTROL_OF, MAS_TEAMS, METHODS, ReproduceError


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


def eval_overrides(args: argparse.Namespace, seed: int) -> list[str]:
    """An evaluation's ``--set``: the invocation's, and the rollout seed it samples with (the training
    seed of the runs it plays; the warm start is played once per training seed, each its own draw)."""
    return [*args.overrides, f"actor_rollout_ref.rollout.seed={seed}"]


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
    return {"source": source, "split": split, "problems": problems, "episodes": args.episodes, "samples": args.samples, "seed": seed,
            "configs": {label: flat_config(recipe, eval_overrides(args, seed), Path(args.recipes)) for label, recipe in recipes.items()},
            "warm": {label: warm[label] for label in recipes}, "trained": trained, "swap": swap}


def recorded(fp: dict, key: str):
    """A fingerprint's ``key``; one written before ``samples`` was recorded played one episode per problem."""
    return fp.get(key, 1 if key == "samples" else None)


def fingerprint_changes(saved: dict, now: dict) -> list[str]:
    """Why a saved "before" cannot stand for the one asked for now, in words (empty: it can)."""
    reasons = []
    if saved.get("source") != now["source"]:
        reasons.append(f"the package's source changed (sha256 {str(saved.get('source'))[:12]} -> {now['source'][:12]})")
    if saved.get("problems") != now["problems"]:
        reasons.append(f"the {now['split']} split holds other problems (sha256 {str(saved.get('problems'))[:12]} -> {now['problems'][:12]})")
    for key in ("split", "episodes", "samples", "seed"):
        if recorded(saved, key) != now[key]:
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
