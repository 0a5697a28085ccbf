"""What of a reproduction outlives the machine it ran on (``reproduce --archive DIR``): a folder small
enough to keep under version control, written as each piece finishes and read back into ``--out``
where that lacks it, so that a reproduction longer than a machine's life goes on from where it stood.

- An evaluation keeps its ``fingerprint.json`` (what made it), ``results.json`` and, of its
  ``episodes.jsonl``, what paired comparisons read (``OUTCOME_KEYS``; the transcripts stay in ``--out``).
- A finished training run of LoRA adapters alone (L1) keeps its records (warm start, settings,
  source, weights id, steps), its curve, and the step an evaluation plays: that step's validation and
  each adapter in peft format (~10 MB each for SmolLM2-135M at rank 8). Not verl's checkpoint (the
  base model's weights and the optimizer's state, ~1 GB a step), so a restored run can be evaluated
  (``runs.adapters_only``) but not trained on. A run with a full model is not kept.

- A warm start that is an adapter (a peft folder with its ``warm_start.json``), under ``warm/<folder>``:
  SFT on another machine need not give the same weights (the runs' records hold their sha256), and
  takes its time again. ``make reproduce-real REAL_ARCHIVE=DIR`` copies it back before building one.

Evaluations and runs are keyed by their path relative to ``--out``; a file is written whole or not at all.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from pettingllms_verl.config import ADAPTER_GROUP, EXPORT_DIR, POLICIES_DIR, VAL_METRICS
from pettingllms_verl.files import write_whole

OUTCOME_KEYS = ("run", "swapped", "seed", "success")  # of an episode: what reproduce.read_evaluation reads
EVALUATION_FILES = ("results.json", "fingerprint.json")  # fingerprint.json last: an evaluation is whole once it is there
RUN_RECORDS = ("warm_start.json", "settings.json", "source.json", "trained.json", "latest_checkpointed_iteration.txt")


def keep_evaluation(folder: Path, out: Path, archive: Path) -> None:
    """The finished evaluation in ``folder`` (under ``out``) into ``archive``."""
    kept = archive / folder.relative_to(out)
    kept.mkdir(parents=True, exist_ok=True)
    (kept / "fingerprint.json").unlink(missing_ok=True)  # an earlier one's, until this one is whole
    outcomes = []
    with open(folder / "episodes.jsonl", encoding="utf-8") as f:
        for line in f:
            record = json.loads(line)
            outcomes.append(json.dumps({key: record[key] for key in OUTCOME_KEYS if key in record}))
    write_whole(kept / "episodes.jsonl", "".join(line + "\n" for line in outcomes))
    for name in EVALUATION_FILES:
        write_whole(kept / name, (folder / name).read_text())


def keep_run(checkpoints: Path, step: Path, curve: Path, out: Path, archive: Path) -> bool:
    """A finished run (its ``checkpoints`` folder under ``out``) into ``archive``: its records, its
    ``curve`` and, of ``step`` (the step its evaluations play), the validation and the adapters.
    False, keeping nothing, when the run holds a full model (its weights are too large to keep)."""
    groups = sorted(p.name for p in (step / POLICIES_DIR).iterdir()) if (step / POLICIES_DIR).is_dir() else []
    adapters = step / POLICIES_DIR / ADAPTER_GROUP / EXPORT_DIR
    if groups != [ADAPTER_GROUP] or not adapters.is_dir():
        return False
    kept = archive / checkpoints.relative_to(out)
    staging = kept.with_name(kept.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    kept_step = staging / step.name
    shutil.copytree(adapters, kept_step / POLICIES_DIR / ADAPTER_GROUP / EXPORT_DIR)
    model_config = step / POLICIES_DIR / ADAPTER_GROUP / "huggingface" / "config.json"  # what runs.check_checkpoint compares
    if model_config.is_file():
        (kept_step / POLICIES_DIR / ADAPTER_GROUP / "huggingface").mkdir(parents=True)
        shutil.copy2(model_config, kept_step / POLICIES_DIR / ADAPTER_GROUP / "huggingface" / "config.json")
    shutil.copy2(step / VAL_METRICS, kept_step / VAL_METRICS)
    for name in RUN_RECORDS:
        shutil.copy2(checkpoints / name, staging / name)
    if curve.is_file():
        shutil.copy2(curve, staging / "curve.jsonl")
    shutil.rmtree(kept, ignore_errors=True)
    staging.rename(kept)
    return True


def keep_warm(folder: Path, sha256: str | None, archive: Path, weights_sha256) -> bool:
    """An adapter warm start into ``archive/warm/<its folder's name>`` unless kept there with the same
    weights (``sha256``, by ``weights_sha256(folder)``); False for a folder that is not one (a full model)."""
    if not ((folder / "adapter_config.json").is_file() and (folder / "warm_start.json").is_file()):
        return False
    kept = archive / "warm" / folder.name
    if kept.is_dir() and weights_sha256(kept) == sha256:
        return True
    staging = kept.with_name(kept.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(folder, staging)
    shutil.rmtree(kept, ignore_errors=True)
    staging.rename(kept)
    return True


def restore(archive: Path, out: Path, finished_steps) -> list[str]:
    """Into ``out``, each archived evaluation it lacks and each archived run it holds fewer steps of
    (``finished_steps(folder)``; its own, if any, moved to ``<run>.replaced``). Returns what was restored,
    by path relative to ``out``."""
    restored = []
    for fingerprint in sorted(archive.glob("*/*/*/fingerprint.json")):  # before|after / split / s<seed>
        folder = fingerprint.parent
        target = out / folder.relative_to(archive)
        if (target / "fingerprint.json").is_file():
            continue
        target.mkdir(parents=True, exist_ok=True)
        for name in ("episodes.jsonl", *EVALUATION_FILES):
            write_whole(target / name, (folder / name).read_text())
        restored.append(str(folder.relative_to(archive)))
    for record in sorted(archive.glob("checkpoints/*/trained.json")):
        run = record.parent
        target = out / run.relative_to(archive)
        if finished_steps(target) >= finished_steps(run):
            continue
        if target.exists():
            replaced = target.with_name(target.name + ".replaced")
            shutil.rmtree(replaced, ignore_errors=True)
            target.rename(replaced)
        shutil.copytree(run, target, ignore=shutil.ignore_patterns("curve.jsonl"))
        if (run / "curve.jsonl").is_file():
            (out / "logs").mkdir(parents=True, exist_ok=True)
            shutil.copy2(run / "curve.jsonl", out / "logs" / f"{run.name}.jsonl")
        restored.append(str(run.relative_to(archive)))
    return restored
