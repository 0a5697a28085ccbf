"""verl V1 trainer ``mas_sync``: verl's synchronous trainer plus multi-agent metrics.

Select it with ``trainer.v1.trainer_mode=mas_sync``. It runs verl's synchronous schedule
unchanged (rollout -> old log-probs -> advantages -> update -> weight sync, strictly on-policy);
the AT-GRPO grouping itself reaches verl's advantage step through the rows' ``uid`` (see
``rollout/worker.py``). What it adds: the ``mas/`` and ``at_grpo/`` metrics of each step.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict

import numpy as np
import torch
import transfer_queue as tq
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.utils.tensordict_utils import list_of_dict_to_tensordict

from pettingllms_verl.algo import AT_GRPO, group_stats, zero_variance_frac

TRAINER_MODE = "mas_sync"


def episode_metrics(tags: list[dict]) -> dict[str, float]:
    """``mas/`` metrics from the rows' ``extra_fields`` (see ``rollout/agent_loop.py``)."""
    metrics: dict[str, float] = {}
    ends = [t for t in tags if t.get("mas_episode_end")]
    if ends:
        metrics["mas/success"] = float(np.mean([bool(t["mas_success"]) for t in ends]))
        metrics["mas/turns_mean"] = float(np.mean([t["mas_turns"] for t in ends]))
        env_s, generate_s = sum(t["mas_env_s"] for t in ends), sum(t["mas_generate_s"] for t in ends)
        metrics["mas/env_time_frac"] = env_s / max(env_s + generate_s, 1e-9)
    metrics["mas/parse_failure_rate"] = float(np.mean([not t["mas_parse_ok"] for t in tags]))
    by_role: dict[str, list[float]] = defaultdict(list)
    for t in tags:
        by_role[t["mas_role"]].append(t["mas_local_reward"])
    for role, rewards in sorted(by_role.items()):
        metrics[f"mas/{role}/reward_mean"] = float(np.mean(rewards))
    return metrics


@register_trainer(TRAINER_MODE)
class MASTrainer(PPOTrainerSync):
    @property
    def trainer_mode(self) -> str:
        # Registered under its own name, but every "is this the sync trainer?" check in verl
        # (replay buffer, refill, weight sync) must see the synchronous schedule it runs.
        return "sync"

    @trainer_mode.setter
    def trainer_mode(self, _configured_name: str) -> None:
        pass

    def _build_replay_buffer(self):
        # verl's buffer polls for finished episodes every 2 s (not configurable there); on a CPU
        # step of ~3 s that sleep dominates `timing_s/gen`.
        buffer = super()._build_replay_buffer()
        interval = self.config.get("pettingllms", {}).get("replay_poll_interval_s")
        if interval is not None:
            buffer.poll_interval = float(interval)
        return buffer

    def _compute_advantage(self, batch, metrics: dict):
        self._isolate_padding_rows(batch)
        real = [key for key, tag in zip(batch.keys, batch.tags) if not tag.get("is_padding", False)]
        rows = tq.kv_batch_get(keys=real, partition_id=batch.partition_id, select_fields=["uid", "rm_scores", "extra_fields"])
        tags = [dict(t) for t in rows["extra_fields"]]
        if not any("mas_group" in t for t in tags):
            return super()._compute_advantage(batch, metrics)
        index = np.array(list(rows["uid"]), dtype=object)
        scores = torch.stack([s.sum() for s in rows["rm_scores"].unbind(0)])
        metrics.update(episode_metrics(tags))
        if self.config.algorithm.adv_estimator == AT_GRPO:
            metrics.update(group_stats(index))
            metrics["at_grpo/zero_variance_frac"] = zero_variance_frac(scores, index)
        batch = super()._compute_advantage(batch, metrics)
        dump_dir = self.config.get("pettingllms", {}).get("batch_dump_dir")
        if dump_dir:
            self._dump_batch(dump_dir, batch, real, index, scores, tags)
        return batch

    def _dump_batch(self, dump_dir: str, batch, keys: list[str], index, scores: torch.Tensor, tags: list[dict]) -> None:
        """One JSON line per training row of this step, as the advantage step saw it."""
        advantages = tq.kv_batch_get(keys=keys, partition_id=batch.partition_id, select_fields=["advantages"])["advantages"]
        os.makedirs(dump_dir, exist_ok=True)
        with open(os.path.join(dump_dir, f"step_{self.global_steps}.jsonl"), "w") as f:
            for key, group, score, advantage, tag in zip(keys, index, scores.tolist(), advantages.unbind(0), tags):
                row = {"key": key, "group": group, "score": score, "advantage": float(advantage[0]) if advantage.numel() else 0.0}
                row.update({name: value for name, value in tag.items() if name.startswith("mas_")})
                f.write(json.dumps(row) + "\n")

    @staticmethod
    def _isolate_padding_rows(batch) -> None:
        """verl pads the batch to a multiple of the mini-batch size with no-op rows copied from the
        first real row, uid included: give each its own group so it cannot shift a real group's
        mean and std (its response mask is empty, so its own advantage never counts)."""
        padding = [key for key, tag in zip(batch.keys, batch.tags) if tag.get("is_padding", False)]
        if padding:
            fields = list_of_dict_to_tensordict([{"uid": f"padding:{key}"} for key in padding])
            tq.kv_batch_put(keys=padding, partition_id=batch.partition_id, fields=fields)
