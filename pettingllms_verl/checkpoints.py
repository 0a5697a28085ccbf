"""A run's checkpoint folder: how the trainer writes it and how evaluation, the reproduction and the
archive read it. One layout, named here::

    <trainer.default_local_dir>/
        latest_checkpointed_iteration.txt   TRACKER: the last complete step (verl's tracker file)
        global_step_N/                      a step, written as global_step_N.partial and renamed once whole
            policies/<group>/               POLICIES_DIR: verl's checkpoint of each worker group
                huggingface/                HF_DIR: verl's copy of the group's model config and tokenizer
                lora_adapters/<name>/       EXPORT_DIR: the adapter group's adapters, each in peft format
            critics/<group>/                CRITICS_DIR: the value model of each group that has one (gae)
            data.pt                         DATA_STATE: the training dataloader's position
            val_metrics.json                VAL_METRICS: the validation of this step's weights
            transfer_queue/                 QUEUE_DIR: an asynchronous run's episodes under way (verl's layout)
"""

from __future__ import annotations

import os
import re

STEP_PREFIX = "global_step_"
STEP_FOLDER = re.compile(rf"{STEP_PREFIX}(\d+)")  # a step folder's whole name (not a .partial one)
PARTIAL_SUFFIX = ".partial"
TRACKER = "latest_checkpointed_iteration.txt"
POLICIES_DIR = "policies"
EXPORT_DIR = "lora_adapters"
CRITICS_DIR = "critics"
DATA_STATE = "data.pt"
VAL_METRICS = "val_metrics.json"
QUEUE_DIR = "transfer_queue"
HF_DIR = "huggingface"
MODEL_FIELDS = ("model_type", "hidden_size", "num_hidden_layers", "vocab_size")  # what makes two model configs one model


def step_folder(root: str | os.PathLike, step: int) -> str:
    """``root/global_step_<step>``."""
    return os.path.join(os.fspath(root), f"{STEP_PREFIX}{step}")


def step_of(path: str | os.PathLike) -> int | None:
    """The step a ``global_step_N`` folder holds (None: not a step folder)."""
    found = STEP_FOLDER.fullmatch(os.path.basename(os.fspath(path).rstrip(os.sep)))
    return int(found.group(1)) if found else None


def steps_in(root: str | os.PathLike) -> list[int]:
    """The steps saved whole in a run's checkpoint folder, in order."""
    names = os.listdir(root) if os.path.isdir(root) else []
    return sorted(step for name in names if (step := step_of(name)) is not None)


def resume_folder(mode: str, resume_from_path: str | None, default_local_dir: str | None) -> str | None:
    """The step folder a run resumes from, as verl's ``trainer.resume_mode`` defines it (``auto``: the
    step TRACKER names in ``trainer.default_local_dir``; ``resume_path``: ``trainer.resume_from_path``;
    ``disable``), or None. A bad value raises ValueError naming the key."""
    if mode == "disable":
        return None
    if mode == "resume_path":
        if step_of(str(resume_from_path)) is None:
            raise ValueError(f"trainer.resume_from_path={resume_from_path!r}: name a global_step_N folder")
        return os.path.abspath(str(resume_from_path))
    if mode != "auto":
        raise ValueError(f"trainer.resume_mode={mode!r}: use auto, resume_path or disable")
    if not default_local_dir or not os.path.isfile(os.path.join(default_local_dir, TRACKER)):
        return None  # a fresh run (verl's reader would say so on stdout)
    from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path

    return find_latest_ckpt_path(os.path.abspath(default_local_dir))


def group_folder(step_dir: str, group: str, groups: int) -> str:
    """A worker group's checkpoint in a step: ``policies/<group>``, or, in a run of one group (of
    ``groups``), verl's own layout (``actor/``) where the step was saved that way."""
    folder = os.path.join(step_dir, POLICIES_DIR, group)
    return os.path.join(step_dir, "actor") if groups == 1 and not os.path.isdir(folder) else folder

