"""The methods compared, the splits they are played on, the primary claim declared before any "after"."""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from pathlib import Path

import pandas as pd

from pettingllms_verl.eval import evaluate
from pettingllms_verl.envs.splits import task_key
from pettingllms_verl.eval import runs
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
