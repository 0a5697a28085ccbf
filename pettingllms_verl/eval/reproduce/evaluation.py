"""The evaluations before and after training (``pettingllms-eval``'s), kept from an earlier invocation where made from the same things."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


from pettingllms_verl.eval import evaluate
from pettingllms_verl.eval import archive
from pettingllms_verl.files import write_whole
from pettingllms_verl.eval.reproduce.fingerprints import alike_starts, eval_overrides, fingerprint_changes, recorded, warm_names
from pettingllms_verl.eval.reproduce.methods import CONTROL_OF, PRIMARY_FILE, ReproduceError, run_label


def evaluate_runs(specs: list[str], args: argparse.Namespace, out: Path, seed: int, split: str, swap: bool = True) -> dict:
    """``pettingllms-eval`` of ``specs`` on ``split`` into ``out``, sampling with rollout seed ``seed``
    (two-policy runs also swapped unless ``swap`` is false): its results.json, with ``outcomes``."""
    argv = [*specs, "--out", str(out), "--recipes", args.recipes, "--jobs", str(args.jobs), "--split", split,
            *(f"--set={o}" for o in eval_overrides(args, seed))]
    if not swap:
        argv += ["--swap", "none"]
    if args.episodes:
        argv += ["--episodes", str(args.episodes)]
    if args.samples > 1:
        argv += ["--samples", str(args.samples)]
    if evaluate.main(argv) != 0:
        raise ReproduceError(f"evaluation into {out} failed (pettingllms-eval said why above; a started run's log is {out}/runs/<label>/main_ppo.log)")
    return read_evaluation(out)


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
                      ("episodes", "with other problem counts (--episodes)"), ("samples", "with other episodes per problem (--samples)")):
        for split in [None] if key == "source" else args.splits:
            values: dict[str, list[str]] = {}
            for folder, fp in prints.items():
                if split is None or folder.parent.name == split:
                    values.setdefault(str(recorded(fp, key)), []).append(str(folder.relative_to(saved)))
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
