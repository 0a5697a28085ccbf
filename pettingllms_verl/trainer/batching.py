"""How a policy's rows reach its workers: padded and balanced over data-parallel ranks (by whole
AT-GRPO groups with the shared-prefix forward), padding spread over the optimizer steps, and
exactly K mini-batches per update with ``pettingllms.trainer.mini_batches_per_step``.

``PolicyBatching`` overrides verl's ``PPOTrainer`` hooks for this; the trainer (``mas_trainer.py``)
mixes it in and calls them per policy, pointed at that policy's worker group and config.
"""

from __future__ import annotations

import contextlib
import math

import torch
import transfer_queue as tq
from omegaconf import open_dict
from transfer_queue import KVBatchMeta
from verl.trainer.ppo.padding_utils import upsample_batch_to_divisible_size
from verl.utils.seqlen_balancing import calculate_workload, log_seqlen_unbalance

from pettingllms_verl.trainer.shared_prefix import ranks_of_groups


def check_groups_within_policies(index, policies: list[str]) -> None:
    """An advantage group mixes rows of two policies only through a bug (AT-GRPO keys hold the role)."""
    seen: dict[str, str] = {}
    for group, policy in zip(index, policies):
        if seen.setdefault(group, policy) != policy:
            raise AssertionError(f"advantage group {group!r} spans policies {seen[group]!r} and {policy!r}")


def spread_padding(is_padding: list[bool], ranks: int, mini_batches: int) -> tuple[list[int], float]:
    """A row order that spreads padding rows evenly over the optimizer steps of an update.

    verl hands data-parallel rank r the r-th contiguous chunk of the batch and cuts each chunk into
    ``mini_batches`` consecutive mini-batches (one optimizer step each, over every rank's j-th
    piece). Its padding rows sit at the end, so the last step could hold one real row. Here each
    chunk keeps its real rows in order and deals its padding rows round-robin over its
    mini-batches (rows stay on their rank: the balancing over ranks is kept).

    Args:
        is_padding: (bs,) whether each row is padding, in the batch's order; bs divisible by
            ``ranks * mini_batches``.

    Returns:
        the new order (indices into the batch, (bs,)) and the smallest real-row share of any
        optimizer step (over all ranks' pieces of it) in that order.
    """
    size = len(is_padding)
    if size % (ranks * mini_batches):
        raise ValueError(f"{size} rows do not split into {ranks} ranks x {mini_batches} mini-batches")
    chunk, piece = size // ranks, size // ranks // mini_batches
    order, real_per_step = [], [0] * mini_batches
    for start in range(0, size, chunk):
        rows = range(start, start + chunk)
        real = [i for i in rows if not is_padding[i]]
        pads = [i for i in rows if is_padding[i]]
        # pads per mini-batch as even as they go; real rows fill the rest, in order
        quota = [len(pads) // mini_batches + (j < len(pads) % mini_batches) for j in range(mini_batches)]
        for j in range(mini_batches):
            take = piece - quota[j]
            order += real[:take] + pads[: quota[j]]
            real, pads = real[take:], pads[quota[j]:]
            real_per_step[j] += take
    return order, min(real_per_step) / (piece * ranks)


class PolicyBatching:
    """verl's batching hooks, per policy (mixed into the trainer: reads its ``config``, ``settings``,
    ``actor_rollout_ref`` worker group and tokenizer)."""

    def _balance_batch(self, batch: KVBatchMeta, metrics, logging_prefix="global_seqlen", keep_minibatch=False):
        """verl's padding and balancing over data-parallel ranks; with the shared-prefix forward on,
        balanced by whole AT-GRPO groups instead of rows (``shared_prefix.ranks_of_groups``), so the
        K branches of one prompt land on one rank, adjacent, and share their prompt's forward there."""
        if not self.config.actor_rollout_ref.actor.get("use_prefix_grouper", False):
            return super()._balance_batch(batch, metrics, logging_prefix, keep_minibatch)
        dp_size = self._dp_size()
        batch = upsample_batch_to_divisible_size(batch, self._get_required_batch_multiple(dp_size), self.tokenizer.eos_token_id)
        seq_lens = [int(tag["seq_len"]) for tag in batch.tags]
        tags = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["extra_fields"])["extra_fields"]
        groups: dict[str, list[int]] = {}
        for i, (tag, meta) in enumerate(zip(tags, batch.tags)):  # verl's padding rows copy row 0's tags: each stands alone
            real = isinstance(tag, dict) and "mas_group" in tag and not meta.get("is_padding")
            groups.setdefault(tag["mas_group"] if real else f"row{i}", []).append(i)
        workloads = calculate_workload(torch.tensor(seq_lens, dtype=torch.int64)).tolist()
        partitions = ranks_of_groups(list(groups.values()), workloads, dp_size)
        batch.reorder([i for rows in partitions for i in rows])
        metrics.update(log_seqlen_unbalance(seqlen_list=seq_lens, partitions=partitions, prefix=logging_prefix))
        return batch

    def _dp_size(self) -> int:
        """The actor's data-parallel size (verl's dispatch info, queried once as verl does)."""
        wg = self.actor_rollout_wg
        if "actor" not in wg._dispatch_info:
            wg._dispatch_info["actor"] = wg._query_dispatch_info("actor")
        return max(wg._dispatch_info["actor"]) + 1

    def _get_required_batch_multiple(self, dp_size: int) -> int:
        k = self.settings.trainer.mini_batches_per_step
        if k is None:
            return super()._get_required_batch_multiple(dp_size)
        return math.lcm(dp_size, self.config.actor_rollout_ref.rollout.n) * k

    def _update_actor(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        """verl's update, with the padding rows spread over its optimizer steps (``spread_padding``;
        ``actor/mini_batch_real_frac_min``: the smallest real-row share of a step; not with
        ``actor.shuffle``, where verl draws each rank's mini-batches at random); with
        ``trainer.mini_batches_per_step`` = K the policy's rows (padded to a multiple of K) are split
        into exactly K mini-batches, whatever the episodes' lengths."""
        actor = self.config.actor_rollout_ref.actor
        n = self.config.actor_rollout_ref.rollout.n
        k = self.settings.trainer.mini_batches_per_step
        if not actor.get("shuffle", False):  # shuffled, verl deals each rank's rows into mini-batches itself
            mini_batches = k if k is not None else len(batch) // (actor.ppo_mini_batch_size * n)
            order, metrics["actor/mini_batch_real_frac_min"] = spread_padding(
                [bool(tag.get("is_padding", False)) for tag in batch.tags], self._dp_size(), mini_batches
            )
            batch.reorder(order)
        with self._exactly_k_mini_batches(actor, len(batch)):
            return super()._update_actor(batch, metrics)

    def _update_critic(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        with self._exactly_k_mini_batches(self.config.critic, len(batch)):
            return super()._update_critic(batch, metrics)

    @contextlib.contextmanager
    def _exactly_k_mini_batches(self, section, rows: int):
        """With ``trainer.mini_batches_per_step`` = K, ``section.ppo_mini_batch_size`` (actor or critic)
        set for the update so that its ``rows`` split into exactly K mini-batches."""
        k = self.settings.trainer.mini_batches_per_step
        if k is None:
            yield
            return
        configured = section.ppo_mini_batch_size
        with open_dict(section):
            section.ppo_mini_batch_size = rows // k // self.config.actor_rollout_ref.rollout.n
        try:
            yield
        finally:
            with open_dict(section):
                section.ppo_mini_batch_size = configured
