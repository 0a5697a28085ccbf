"""Shared-prefix forward for AT-GRPO groups, in verl's V1 FSDP engine (old log-probs, reference, update).

An AT-GRPO group is K replies to one identical prompt, and in multi-turn episodes the prompt is
most of each row. verl's engine feeds every row whole; here the rows of a micro-batch whose prompts
are token-for-token identical become one sequence ``[prompt, reply_1, ..., reply_K]`` whose
attention mask lets each reply see the prompt and itself only, with each reply's own position ids.
The logits are then gathered back into verl's per-row layout, so everything after the forward
(temperature, log-probs, entropy, the loss, the gradient flowing into the one prompt pass) is
verl's own code on the same numbers. Groups are found by comparing tokens, never from tags: rows
with different prompts are never merged, a singleton is just a row.

verl's micro-batching balances rows by length and would split a group, so while sharing is on the
engine partitions each mini-batch into micro-batches of whole groups (counting each prompt once
against ``max_token_len_per_gpu``, or whole groups up to ``micro_batch_size_per_gpu`` rows).

Switched by verl's ``actor_rollout_ref.actor.use_prefix_grouper`` (verl's own key for this; its V1
engine ignores it). Where the shared forward cannot run (Ulysses SP, fused kernels, static
padding, multi-modal rows, an attention implementation other than sdpa/eager), the engine logs
why once and runs verl's plain path.

- pure functions: ``prompt_lengths``, ``identical_prompt_groups``, ``partition``, ``pack``;
- ``SharedPrefixFSDPEngine``: verl's ``FSDPEngineWithLMHead`` using them;
- ``SharedPrefixTrainingWorker`` / ``SharedPrefixActorRolloutRefWorker``: verl's workers on it.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass

import torch
from tensordict import TensorDict
from verl.single_controller.base.decorator import Dispatch, register
from verl.utils import tensordict_utils as tu
from verl.utils.model import extract_multi_modal_inputs
from verl.utils.seqlen_balancing import restore_dynamic_batch
from verl.workers.engine import FSDPEngineWithLMHead
from verl.workers.engine.fsdp import transformer_impl
from verl.workers.engine_workers import ActorRolloutRefWorker, TrainingWorker

logger = logging.getLogger(__name__)

SWITCH = "actor_rollout_ref.actor.use_prefix_grouper"
MASKED_ATTENTION = ("sdpa", "eager")  # implementations that take an arbitrary 4D mask


def prompt_lengths(data: TensorDict) -> torch.Tensor:
    """(bsz,) prompt length of each row of a verl no-padding batch (as ``no_padding_2_padding``)."""
    prompts = data["prompts"]
    if prompts.is_nested:
        return prompts.offsets().diff()
    return data["attention_mask"][:, : prompts.shape[1]].sum(dim=1)


def identical_prompt_groups(input_ids: torch.Tensor, prompt_lens: torch.Tensor) -> list[list[int]]:
    """Rows whose prompts are token-for-token identical, in first-seen order.

    input_ids: nested (bsz, j) rows of prompt + reply; prompt_lens: (bsz,).
    """
    groups: dict[bytes, list[int]] = {}
    for row, (ids, length) in enumerate(zip(input_ids.unbind(), prompt_lens.tolist(), strict=True)):
        key = ids[:length].cpu().numpy().tobytes()
        groups.setdefault(key, []).append(row)
    return list(groups.values())


def partition(
    groups: list[list[int]],
    prompt_lens: list[int],
    seq_lens: list[int],
    *,
    max_rows: int | None = None,
    max_tokens: int | None = None,
) -> list[list[int]]:
    """Micro-batches (row-index lists) of whole groups, filled in order.

    A micro-batch takes whole groups while it stays within ``max_rows`` rows or ``max_tokens``
    tokens, a shared prompt counted once. A group bigger than the budget on its own is one
    micro-batch under a row budget (its tokens are fewer than the rows' anyway) and is cut into
    parts under a token budget (each part still shares its prompt).
    """
    if (max_rows is None) == (max_tokens is None):
        raise ValueError("partition needs exactly one of max_rows, max_tokens")

    def cost(rows: list[int]) -> int:
        if max_rows is not None:
            return len(rows)
        return prompt_lens[rows[0]] + sum(seq_lens[r] - prompt_lens[r] for r in rows)

    budget = max_rows if max_rows is not None else max_tokens
    pieces: list[list[int]] = []
    for group in groups:
        if max_tokens is not None and cost(group) > budget:
            part: list[int] = []
            for row in group:
                if part and cost(part + [row]) > budget:
                    pieces.append(part)
                    part = []
                part.append(row)
            pieces.append(part)
        else:
            pieces.append(group)
    parts: list[list[int]] = []
    used = 0
    for piece in pieces:
        # pieces of one group stay separate parts: merging them back is the cut undone
        if parts and used + cost(piece) <= budget:
            parts[-1] += piece
            used += cost(piece)
        else:
            parts.append(list(piece))
            used = cost(piece)
    return parts


def split_to(parts: list[list[int]], count: int) -> list[list[int]]:
    """``parts`` cut (the largest first, in halves) until there are ``count``: every data-parallel
    rank must run the same number of micro-batches."""
    parts = [list(part) for part in parts]
    while len(parts) < count:
        largest = max(range(len(parts)), key=lambda i: len(parts[i]))
        if len(parts[largest]) < 2:
            raise ValueError(f"cannot cut {sum(map(len, parts))} rows into {count} micro-batches")
        part = parts.pop(largest)
        parts[largest:largest] = [part[: len(part) // 2], part[len(part) // 2 :]]
    return parts


@dataclass
class Packed:
    """A micro-batch with each group's prompt once: one sequence per group, right-padded.

    input_ids, position_ids: (groups, length); allowed: (groups, 1, length, length) bool, True where a
    query token may attend to a key token; index: (total_nnz,) for each token of verl's packed rows
    (row order, prompt + reply), its position in the flattened (groups * length) sequence.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    allowed: torch.Tensor
    index: torch.Tensor
    tokens: int  # tokens of the shared sequences, without their right padding


def pack(input_ids: torch.Tensor, position_ids: torch.Tensor, prompt_lens: torch.Tensor, groups: list[list[int]], pad_token_id: int = 0) -> Packed:
    """Build the shared sequences of ``groups`` (row indices into the nested ``input_ids`` /
    ``position_ids`` of one micro-batch; every row in exactly one group).

    Segment 0 of a group is the prompt, segment j >= 1 its j-th reply; a query token may attend to a
    key token of its own group that is not after it and is in the prompt or in its own segment.
    """
    rows = input_ids.unbind()
    positions = position_ids.unbind()
    lens = [int(p) for p in prompt_lens.tolist()]
    seq_ids, seq_pos, seq_seg = [], [], []
    starts: dict[int, tuple[int, int, int]] = {}  # row -> (group, its prompt length, offset of its reply)
    for g, group in enumerate(groups):
        p = lens[group[0]]
        ids, pos, seg = [rows[group[0]][:p]], [positions[group[0]][:p]], [torch.zeros(p, dtype=torch.long)]
        offset = p
        for j, row in enumerate(group, start=1):
            reply = rows[row][p:]
            starts[row] = (g, p, offset)
            ids.append(reply)
            pos.append(positions[row][p:])
            seg.append(torch.full((len(reply),), j, dtype=torch.long))
            offset += len(reply)
        seq_ids.append(torch.cat(ids))
        seq_pos.append(torch.cat(pos))
        seq_seg.append(torch.cat(seg))
    length = max(len(s) for s in seq_ids)
    n_groups = len(groups)
    device = input_ids.device
    out_ids = torch.full((n_groups, length), pad_token_id, dtype=seq_ids[0].dtype, device=device)
    out_pos = torch.zeros((n_groups, length), dtype=seq_pos[0].dtype, device=device)
    segment = torch.full((n_groups, length), -1, dtype=torch.long)  # -1: right padding
    for g in range(n_groups):
        n = len(seq_ids[g])
        out_ids[g, :n], out_pos[g, :n], segment[g, :n] = seq_ids[g], seq_pos[g], seq_seg[g]
    q_seg, k_seg = segment.unsqueeze(2), segment.unsqueeze(1)
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    allowed = causal & (k_seg >= 0) & ((k_seg == 0) | (k_seg == q_seg))
    # a padding query attends to itself only: a fully masked row would put NaN into the backward
    allowed |= torch.eye(length, dtype=torch.bool) & (q_seg < 0)
    index = []
    for row in range(len(rows)):
        g, p, offset = starts[row]
        prompt = torch.arange(p) + g * length
        reply = torch.arange(len(rows[row]) - p) + g * length + offset
        index.append(torch.cat([prompt, reply]))
    tokens = int((segment >= 0).sum())
    return Packed(out_ids, out_pos, allowed.unsqueeze(1).to(device), torch.cat(index).to(device), tokens)


class SharedPrefixFSDPEngine(FSDPEngineWithLMHead):
    """verl's FSDP engine with the shared-prefix forward (see the module docstring)."""

    share_prefix: bool = False  # set by the worker from ``SWITCH``
    _plain_reasons: set  # reasons already logged for running the plain path

    def _why_plain(self, data: TensorDict) -> str | None:
        """Why this batch cannot take the shared forward (None: it can)."""
        get = lambda key, default: tu.get_non_tensor_data(data=data, key=key, default=default)  # noqa: E731
        attention = getattr(getattr(self.module, "config", None), "_attn_implementation", None)
        if self.use_ulysses_sp:
            return "Ulysses sequence parallelism splits the packed sequence"
        if get("use_fused_kernels", False):
            return "fused kernels do not return the logits the shared forward gathers"
        if self.pad_to_length:
            return "engine.pad_to_length pads the packed sequence to static lengths"
        if extract_multi_modal_inputs(data.get("multi_modal_inputs", [])):
            return "multi-modal rows"
        if data["position_ids"].dim() == 3:
            return "multi-axis (mrope) position ids"
        if "prompts" not in data.keys():
            return "the batch carries no prompts to find the groups by"
        if attention not in MASKED_ATTENTION:
            return f"attn_implementation={attention!r} takes no arbitrary attention mask (use one of {MASKED_ATTENTION})"
        return None

    def _sharing(self, data: TensorDict) -> bool:
        if not self.share_prefix:
            return False
        reason = self._why_plain(data)
        if reason is None:
            return True
        reasons = self.__dict__.setdefault("_plain_reasons", set())
        if reason not in reasons:
            reasons.add(reason)
            logger.warning("%s=True: running verl's plain forward, because of %s", SWITCH, reason)
        return False

    def _micro_batch_parts(self, data: TensorDict) -> list[list[int]]:
        prompt_lens = prompt_lengths(data)
        groups = identical_prompt_groups(data["input_ids"], prompt_lens)
        seq_lens = data["input_ids"].offsets().diff().tolist()
        if tu.get_non_tensor_data(data=data, key="use_dynamic_bsz", default=True):
            budget = {"max_tokens": int(data["max_token_len_per_gpu"])}
        else:
            budget = {"max_rows": int(data["micro_batch_size_per_gpu"])}
        parts = partition(groups, prompt_lens.tolist(), seq_lens, **budget)
        count = torch.tensor(len(parts), device=transformer_impl.get_device_id())
        torch.distributed.all_reduce(count, op=torch.distributed.ReduceOp.MAX, group=self.get_data_parallel_group())
        return split_to(parts, int(count))

    def forward_backward_batch(self, data: TensorDict, loss_function, forward_only=False):
        if not self._sharing(data):
            self._shared_now = False
            return super().forward_backward_batch(data, loss_function, forward_only)
        parts = self._micro_batch_parts(data)
        self._shared_now, self._token_counts = True, [0, 0]
        with _micro_batches(parts):
            output = super().forward_backward_batch(data, loss_function, forward_only)
        self._shared_now = False
        if not tu.get_non_tensor_data(data=data, key="use_dynamic_bsz", default=True):
            # verl restores the row order only after its own dynamic batching
            output["model_output"] = {k: restore_dynamic_batch(v, parts) for k, v in output["model_output"].items()}
        plain, shared = self._token_counts
        output["metrics"]["shared_prefix/token_frac"] = [shared / max(plain, 1)]
        return output

    def prepare_model_inputs(self, micro_batch: TensorDict):
        if not getattr(self, "_shared_now", False):
            return super().prepare_model_inputs(micro_batch)
        input_ids = micro_batch["input_ids"]
        prompt_lens = prompt_lengths(micro_batch)
        groups = identical_prompt_groups(input_ids, prompt_lens)
        plain = int(input_ids.offsets()[-1])
        if len(groups) == len(prompt_lens):  # no two rows share a prompt: verl's own inputs
            self._token_counts[0] += plain
            self._token_counts[1] += plain
            return super().prepare_model_inputs(micro_batch)
        # verl's outputs in its packed layout (1, total_nnz), whatever use_remove_padding says: the
        # padded layout would materialise (bsz, max_seq_len, vocab) gathered logits and take the
        # entropy over its padding too
        packed_view = micro_batch.copy()
        tu.assign_non_tensor(packed_view, use_remove_padding=True)
        _, output_args = super().prepare_model_inputs(packed_view)
        pad_token_id = tu.get_non_tensor_data(data=micro_batch, key="pad_token_id", default=0)
        packed = pack(input_ids, micro_batch["position_ids"], prompt_lens, groups, pad_token_id)
        self._token_counts[0] += plain
        self._token_counts[1] += packed.tokens
        mask = packed.allowed
        if self.module.config._attn_implementation == "eager":  # eager attention adds the mask to the scores
            mask = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device).masked_fill(~mask, torch.finfo(torch.float32).min)
        model_inputs = {"input_ids": packed.input_ids, "attention_mask": mask, "position_ids": packed.position_ids}
        output_args["shared_prefix"] = (packed.index.unsqueeze(0), packed_view)
        return model_inputs, output_args

    def prepare_model_outputs(self, output, output_args, micro_batch: TensorDict, logits_processor_func):
        shared = output_args.pop("shared_prefix", None)
        if shared is not None:
            # each row's logits from its group's sequence, in verl's packed layout: the prompt's computed once
            layout, micro_batch = shared
            output.logits = output.logits.flatten(0, 1)[layout]
        return super().prepare_model_outputs(output, output_args, micro_batch, logits_processor_func)


@contextlib.contextmanager
def _micro_batches(parts: list[list[int]]):
    """verl's engine loop over our micro-batches of whole groups. verl has no hook for the
    partition (``prepare_micro_batches`` is a module-level function of its engine), so it is
    swapped for the duration of one ``forward_backward_batch`` call."""
    original = transformer_impl.prepare_micro_batches

    def by_group(data, **_):
        return [tu.index_select_tensor_dict(data, part) for part in parts], parts

    transformer_impl.prepare_micro_batches = by_group
    try:
        yield
    finally:
        transformer_impl.prepare_micro_batches = original


class SharedPrefixTrainingWorker(TrainingWorker):
    """verl's training worker on ``engine_cls`` (verl's FSDP engine plus the shared-prefix forward)."""

    engine_cls: type[SharedPrefixFSDPEngine] = SharedPrefixFSDPEngine

    def __init__(self, config):
        super().__init__(config)
        if type(self.engine) is FSDPEngineWithLMHead:
            # Same object, our subclass: the engine's constructor already built its device meshes
            # (and process groups); the model is built later, in reset(), by the subclass's methods.
            self.engine.__class__ = self.engine_cls


class SharedPrefixActorRolloutRefWorker(ActorRolloutRefWorker):
    """verl's hybrid worker whose actor and reference use the shared-prefix forward when ``SWITCH`` is on."""

    actor_worker_cls = SharedPrefixTrainingWorker
    ref_worker_cls = SharedPrefixTrainingWorker

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self):
        super().init_model()
        share = bool(self.config.actor.get("use_prefix_grouper", False))
        for worker in (getattr(self, "actor", None), getattr(self, "ref", None)):
            if worker is not None:
                engine = worker.engine
                if isinstance(engine, SharedPrefixFSDPEngine):
                    engine.share_prefix = share
                elif share:
                    logger.warning("%s=True: %s has no shared-prefix forward; running it plainly", SWITCH, type(engine).__name__)
