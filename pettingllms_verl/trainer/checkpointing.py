"""A checkpoint per policy (``pettingllms_verl/checkpoints.py`` names the layout): each worker group's
weights, optimizer and scheduler, each critic, the dataloader and an asynchronous run's episodes
under way, saved whole or not at all, and resumed as verl's ``trainer.resume_mode`` says.

``PolicyCheckpoints`` overrides verl's ``PPOTrainer`` checkpoint hooks; the trainer (``mas_trainer.py``)
mixes it in.
"""

from __future__ import annotations

import os
import shutil

import ray
import torch
import transfer_queue as tq
from verl.trainer.ppo.v1.trainer_base import _count_tq_prompt_groups

from pettingllms_verl.checkpoints import (CRITICS_DIR, DATA_STATE, PARTIAL_SUFFIX, POLICIES_DIR, QUEUE_DIR, TRACKER, group_folder, resume_folder, step_folder,
                                          step_of, steps_in)
from pettingllms_verl.config import SECTION
from pettingllms_verl.files import write_whole
from pettingllms_verl.placement import actors_of, blind_nodes


class PolicyCheckpoints:
    """verl's checkpoint hooks over every policy's worker group (mixed into the trainer: reads its
    ``config``, ``groups``, ``train_dataloader``, ``trainer_mode`` and ``global_steps``)."""

    def _check_checkpoint_folder(self, placement: dict[str, dict[str, list[str]]]) -> None:
        """Every trainer rank writes its shards into trainer.default_local_dir and reads them back
        on resume, beside this process's files: a node that does not see the folder as this
        process does would save a checkpoint no resume can find whole. Refused before step 1."""
        trainer = self.config.trainer
        if trainer.val_only or (trainer.save_freq <= 0 and trainer.resume_mode == "disable"):
            return  # nothing is saved to it nor resumed from it
        folder = str(trainer.default_local_dir)
        for name, group in self.groups.items():
            try:
                blind = blind_nodes(folder, actors_of(group)["trainer"], placement[name]["trainer"])
            except OSError as error:
                raise ValueError(f"trainer.default_local_dir: checkpoints cannot be written to {folder}: {error}") from None
            if blind:
                raise ValueError(
                    f"trainer.default_local_dir: {folder} is not the same folder on node(s) {', '.join(blind)} "
                    f"(trainer ranks of {name}) as on this node ({ray.get_runtime_context().get_node_id()}): "
                    "a file written here is not there. Every node must see one folder for checkpoints to resume: "
                    "an absolute path on storage every node mounts (docs/cluster.md)."
                )

    def _save_checkpoint(self):
        """``global_step_N/policies/<group>/`` per worker group (weights, optimizer, scheduler; the
        adapter group also each adapter in peft format), ``critics/<group>/`` per critic (gae) and the dataloader, written under a
        temporary name and renamed when complete; then the tracker file (renamed too), then older
        step folders beyond ``trainer.max_actor_ckpt_to_keep`` are removed. A run killed at any
        point leaves the last complete checkpoint named by the tracker, and no partial folder under
        a step's name."""
        trainer = self.config.trainer
        root = trainer.default_local_dir
        step_dir = step_folder(root, self.global_steps)
        partial = step_dir + PARTIAL_SUFFIX
        shutil.rmtree(partial, ignore_errors=True)  # left by a run killed while saving this step
        for name, group in self.groups.items():
            for folder, workers in ((POLICIES_DIR, group.worker_group), (CRITICS_DIR, group.critic)):
                if workers is None:
                    continue
                remote = None if trainer.default_hdfs_dir is None else os.path.join(
                    step_folder(trainer.default_hdfs_dir, self.global_steps), folder, name
                )
                # Retention is done below, over whole step folders: verl's would delete by the
                # temporary paths it was given.
                workers.save_checkpoint(os.path.join(partial, folder, name), remote, self.global_steps, max_ckpt_to_keep=None)
        os.makedirs(partial, exist_ok=True)
        torch.save(self.train_dataloader.state_dict(), os.path.join(partial, DATA_STATE))
        if self.trainer_mode != "sync":  # the episodes under way (verl re-issues them on resume)
            tq.save_checkpoint(os.path.join(partial, QUEUE_DIR), metadata={"global_steps": self.global_steps})
        shutil.rmtree(step_dir, ignore_errors=True)  # a stale one (e.g. a run restarted from an earlier step)
        os.replace(partial, step_dir)
        tracker = os.path.join(root, TRACKER)
        write_whole(tracker, str(self.global_steps))
        self._remove_old_checkpoints(trainer.get("max_actor_ckpt_to_keep", None))
        self.checkpoint_callback.on_save(trainer=self, global_step=self.global_steps, checkpoint_dir=step_dir, async_save=False)

    def _remove_old_checkpoints(self, keep: int | None) -> None:
        if not keep:
            return
        root = self.config.trainer.default_local_dir
        for step in steps_in(root)[:-keep]:
            shutil.rmtree(step_folder(root, step), ignore_errors=True)

    def _load_checkpoint(self):
        self.global_steps = 0
        if not self.groups:
            return  # called inside verl's _setup, before the other groups exist; _setup calls it again
        step_dir = self._resume_folder()
        if step_dir is None:
            return
        self.global_steps = step_of(step_dir)
        print(f"{self.mode}: resuming {sorted(self.groups)} from {step_dir} (step {self.global_steps})", flush=True)
        for name, group in self.groups.items():
            path = group_folder(step_dir, name, len(self.groups))
            if not os.path.isdir(path):
                raise FileNotFoundError(f"{path}: no checkpoint of group {name!r} in {step_dir} (was it added to {SECTION}.policies later?)")
            group.worker_group.load_checkpoint(local_path=path, del_local_after_load=self.config.trainer.del_local_ckpt_after_load)
            if group.critic is not None:
                path = os.path.join(step_dir, CRITICS_DIR, name)
                if not os.path.isdir(path):
                    raise FileNotFoundError(f"{path}: no critic of group {name!r} in {step_dir} (saved without one: train on from it "
                                            "with the estimator it was saved with, or start a run of its own with critic.enable=true)")
                group.critic.load_checkpoint(local_path=path, del_local_after_load=self.config.trainer.del_local_ckpt_after_load)
        data = os.path.join(step_dir, DATA_STATE)
        if os.path.exists(data):
            self.train_dataloader.load_state_dict(torch.load(data, weights_only=False))
        queue = os.path.join(step_dir, QUEUE_DIR)
        if self.trainer_mode != "sync" and os.path.exists(queue):
            # finished episodes come back as they were; those under way are played again from their
            # prompts in fit() (verl's _reissue_inflight_prompts), none trained twice nor lost
            tq.load_checkpoint(queue)
            self._restored_tq_prompt_count = _count_tq_prompt_groups()
            print(f"{self.mode}: {self._restored_tq_prompt_count} problems under way at step {self.global_steps} restored", flush=True)

    def _resume_folder(self) -> str | None:
        """The step folder to resume from (verl's resume_mode semantics), or None."""
        trainer = self.config.trainer
        return resume_folder(trainer.resume_mode, trainer.get("resume_from_path"), trainer.default_local_dir)
