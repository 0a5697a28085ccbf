"""``python -m pettingllms_verl.eval.reproduce``: the command (``make reproduce``), what it trains, plays and writes in order."""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from pathlib import Path

from pettingllms_verl.eval import reproduce  # the package: its docstring is the command's help
from pettingllms_verl.eval import evaluate, runs
from pettingllms_verl.eval.reproduce.evaluation import evaluation, saved_evaluations
from pettingllms_verl.eval.reproduce.fingerprints import (
    alike_starts,
    before_sources,
    fingerprint,
    keep_warm_starts,
    source_hash,
    training_settings,
    warm_names,
    warm_start,
)
from pettingllms_verl.eval.reproduce.methods import (
    DEFAULT_SPLITS,
    LAST,
    METHODS,
    PRIMARY,
    SPLITS,
    SWAPPED,
    TINY,
    ReproduceError,
    check_splits,
    declare_primary,
    primary_claim,
    run_label,
)
from pettingllms_verl.eval.reproduce.report import write_table
from pettingllms_verl.eval.reproduce.training import check_saved, last_step, restore_run, stale, train_all, trained_id


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m pettingllms_verl.eval.reproduce", description=reproduce.__doc__.split("\n\n")[0],
                                     epilog=reproduce.__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", default=",".join(TINY), help=f"comma-separated, of {', '.join(METHODS)} (default {','.join(TINY)})")
    parser.add_argument("--seeds", default="0,1,2,3,4", help="comma-separated training seeds (data order and sampling; default 0,1,2,3,4)")
    parser.add_argument("--steps", type=int, default=None, help="training steps per run (default: the recipes' trainer.total_training_steps)")
    parser.add_argument("--episodes", type=int, default=None, help="test problems per evaluation (default all)")
    parser.add_argument("--samples", type=int, default=1, metavar="N",
                        help="episodes per test problem in each evaluation (pettingllms-eval --samples; default 1): success is then avg@N")
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
    if args.samples < 1:
        parser.error(f"--samples {args.samples}: need at least 1 episode per problem")
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
