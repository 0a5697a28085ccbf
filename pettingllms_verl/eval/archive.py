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
  takes its time again. ``make reproduce-real REAL_ARCHIVE=DIR`` copies it back before building one;
  other weights under that name are never written over it.

Evaluations and runs are keyed by their path relative to ``--out``; a file or folder is written whole
or not at all. What is read back is only what is valid now (``reproduce`` checks it as it checks its own).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from pettingllms_verl.checkpoints import EXPORT_DIR, POLICIES_DIR, VAL_METRICS
from pettingllms_verl.config import ADAPTER_GROUP
from pettingllms_verl.files import write_whole

OUTCOME_KEYS = ("run", "swapped", "seed", "success")  # of an episode: what reproduce.read_evaluation reads
EVALUATION_FILES = ("results.json", "fingerprint.json")  # fingerprint.json last: an evaluation is whole once it is there
RUN_RECORDS = ("warm_start.json", "settings.json", "source.json", "trained.json", "latest_checkpointed_iteration.txt")
WALL_FILE = "wall_s.json"  # in a run's checkpoints: the seconds each of its main_ppo launches took, failed ones too
OPTIONAL_RECORDS = (WALL_FILE,)  # kept where a run has them


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


def keep_run(checkpoints: Path, played: list[Path], curve: Path, out: Path, archive: Path) -> bool:
    """A finished run (its ``checkpoints`` folder under ``out``) into ``archive``: its records, its
    ``curve`` and, of each step in ``played`` (the steps its evaluations play: its best on val and its
    last), the validation and the adapters. False, keeping nothing, when the run holds a full model
    (its weights are too large to keep)."""
    for step in played:
        groups = sorted(p.name for p in (step / POLICIES_DIR).iterdir()) if (step / POLICIES_DIR).is_dir() else []
        if groups != [ADAPTER_GROUP] or not (step / POLICIES_DIR / ADAPTER_GROUP / EXPORT_DIR).is_dir():
            return False
    kept = archive / checkpoints.relative_to(out)
    staging = _staging(kept)
    for step in played:
        kept_step = staging / step.name
        shutil.copytree(step / POLICIES_DIR / ADAPTER_GROUP / EXPORT_DIR, kept_step / POLICIES_DIR / ADAPTER_GROUP / EXPORT_DIR)
        model_config = step / POLICIES_DIR / ADAPTER_GROUP / "huggingface" / "config.json"  # what runs.check_checkpoint compares
        if model_config.is_file():
            (kept_step / POLICIES_DIR / ADAPTER_GROUP / "huggingface").mkdir(parents=True)
            shutil.copy2(model_config, kept_step / POLICIES_DIR / ADAPTER_GROUP / "huggingface" / "config.json")
        if (step / VAL_METRICS).is_file():
            shutil.copy2(step / VAL_METRICS, kept_step / VAL_METRICS)
    for name in RUN_RECORDS:
        shutil.copy2(checkpoints / name, staging / name)
    for name in OPTIONAL_RECORDS:
        if (checkpoints / name).is_file():
            shutil.copy2(checkpoints / name, staging / name)
    if curve.is_file():
        shutil.copy2(curve, staging / "curve.jsonl")
    _publish(staging, kept)
    return True


def keep_warm(folder: Path, sha256: str | None, archive: Path, weights_sha256) -> str | None:
    """An adapter warm start into ``archive/warm/<its folder's name>``. Returns None for a folder that
    is not one (a full model), "kept" when copied or already there with the same weights (``sha256``, by
    ``weights_sha256``), "other" when the archive holds other weights under that name: those that its
    runs were made from, left as they are."""
    if not ((folder / "adapter_config.json").is_file() and (folder / "warm_start.json").is_file()):
        return None
    kept = archive / "warm" / folder.name
    if kept.is_dir():
        return "kept" if weights_sha256(kept) == sha256 else "other"
    _copy_whole(folder, kept)
    return "kept"


def restore_evaluation(kept: Path, folder: Path) -> None:
    """An archived evaluation (``kept``) into ``folder``, its fingerprint last."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("episodes.jsonl", *EVALUATION_FILES):
        write_whole(folder / name, (kept / name).read_text())


def restore_run(kept: Path, checkpoints: Path, curve: Path) -> None:
    """An archived run (``kept``) into ``checkpoints`` (one there moved to ``<run>.replaced``), its curve to ``curve``."""
    if checkpoints.exists():
        replaced = checkpoints.with_name(checkpoints.name + ".replaced")
        shutil.rmtree(replaced, ignore_errors=True)
        checkpoints.rename(replaced)
    _copy_whole(kept, checkpoints, ignore=shutil.ignore_patterns("curve.jsonl"))
    if (kept / "curve.jsonl").is_file():
        curve.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(kept / "curve.jsonl", curve)


def _copy_whole(source: Path, target: Path, ignore=None) -> None:
    """``source`` copied to ``target`` through a staging folder: a copy cut short is never at ``target``."""
    staging = _staging(target)
    shutil.copytree(source, staging, ignore=ignore)
    _publish(staging, target)


def _staging(target: Path) -> Path:
    """Where ``target`` is built before ``_publish`` puts it in place (emptied of a build cut short)."""
    staging = target.with_name(target.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    return staging


def _publish(staging: Path, target: Path) -> None:
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
