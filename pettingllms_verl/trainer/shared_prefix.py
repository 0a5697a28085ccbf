"""Shared-prefix forward for AT-GRPO groups, in verl's V1 FSDP engine (old log-probs, reference, update).

An AT-GRPO group is K replies to one identical prompt, and in multi-turn episodes the prompt is
most of each row. verl's engine feeds every row whole; here the rows of a micro-batch whose prompts
are token-for-token identical become one sequence ``[prompt, reply_1, ..., reply_K]`` whose
attention mask lets each reply see the prompt and itself only, with each reply's own position ids
(the groups of a micro-batch back to back in one row, none seeing another). The LM head runs only
where a reply token is predicted (``logits_to_keep``), and verl's own code (temperature, log-probs,
entropy) runs on those positions of each row, gathered from its group's sequence; the results go
back into verl's packed per-row layout, zeros where nothing reads them (a prompt's predictions of
itself), so the loss and the gradient flowing into the one prompt pass are verl's on the same
numbers. Groups are found by comparing tokens, never from tags: rows with different prompts are
never merged, a singleton is just a row.

verl's micro-batching balances rows by length and would split a group, so while sharing is on the
engine partitions each mini-batch itself, at group boundaries, within ``max_token_len_per_gpu``
tokens (dynamic batching) or the tokens ``micro_batch_size_per_gpu`` of the longest rows would take
(each prompt counted once; a group over the budget is cut into parts that each share their prompt).

Switched by verl's ``actor_rollout_ref.actor.use_prefix_grouper`` (verl's own key for this; its V1
engine ignores it). Where the shared forward cannot run (Ulysses SP, fused kernels, top-k
distillation, static padding, multi-modal rows, sliding-window attention, an attention implementation other than
sdpa/eager), the engine logs why once and runs verl's plain path, on every data-parallel rank.
The attention mask is dense (tokens x tokens per micro-batch): fine on CPU and for short
micro-batches; on GPUs the flash-attention recipes keep the plain path.

- pure functions: ``prompt_lengths``, ``identical_prompt_groups``, ``partition``, ``pack``, ``read_positions``;
- ``SharedPrefixFSDPEngine``: verl's ``FSDPEngineWithLMHead`` using them (on CPU it also builds a
  forward-only model, the KL reference, without the pinned memory verl asks for);
- ``SharedPrefixTrainingWorker`` / ``SharedPrefixActorRolloutRefWorker``: verl's workers on it.
"""

from __future__ import annotations

import contextlib
import inspect
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

from pettingllms_verl.config import ROW_TEMPERATURE
from pettingllms_verl.trainer.vlm_compat import VISION_MODEL_TYPES, fix_text_only_batches

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
    values = input_ids.values().cpu().numpy()  # one copy off the device, sliced per row
    starts = input_ids.offsets().tolist()
    groups: dict[bytes, list[int]] = {}
    for row, length in enumerate(prompt_lens.tolist()):
        groups.setdefault(values[starts[row] : starts[row] + length].tobytes(), []).append(row)
    return list(groups.values())


def partition(groups: list[list[int]], prompt_lens: list[int], seq_lens: list[int], max_tokens: int) -> list[list[int]]:
    """Micro-batches (row-index lists) of whole groups, in order, each within ``max_tokens`` tokens
    as the shared forward runs them (each group's prompt once). A group over the budget on its own
    is cut into parts that fit (each part still shares its prompt); a single row over the budget
    stands alone, as in verl.
    """

    def length(rows: list[int]) -> int:
        return prompt_lens[rows[0]] + sum(seq_lens[r] - prompt_lens[r] for r in rows)

    pieces: list[list[int]] = []
    for group in groups:
        part: list[int] = []
        for row in group:
            if part and length(part + [row]) > max_tokens:
                pieces.append(part)
                part = []
            part.append(row)
        pieces.append(part)
    parts: list[list[int]] = []
    used = 0
    for piece in pieces:
        # two pieces of one cut group never fit together: each is over half the budget or alone
        if parts and used + length(piece) <= max_tokens:
            parts[-1] += piece
            used += length(piece)
        else:
            parts.append(list(piece))
            used = length(piece)
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


def ranks_of_groups(groups: list[list[int]], workloads: list[float], ranks: int) -> list[list[int]]:
    """The rows of a batch over ``ranks`` data-parallel ranks, the same number each (verl's dispatch
    cuts the batch into equal chunks), balanced by workload like verl's balancing, but with every
    group whole on one rank where a rank has room for it: the heaviest group first, to the least
    loaded rank that can take it. A group no rank has room for is cut over the least loaded ranks
    (each part still shares its prompt there). Each rank's rows keep a group's rows adjacent.

    groups: row-index lists covering ``range(n)``; workloads: (n,); n divisible by ``ranks``.
    """
    n = sum(map(len, groups))
    if n % ranks:
        raise ValueError(f"{n} rows do not split evenly over {ranks} ranks")
    room, load = [n // ranks] * ranks, [0.0] * ranks
    rows: list[list[int]] = [[] for _ in range(ranks)]
    weight = lambda group: sum(workloads[r] for r in group)  # noqa: E731
    for group in sorted(groups, key=lambda g: (-weight(g), g[0])):
        fits = [rank for rank in range(ranks) if room[rank] >= len(group)]
        targets = [min(fits, key=lambda rank: (load[rank], rank))] if fits else sorted(range(ranks), key=lambda rank: (load[rank], rank))
        rest = list(group)
        for rank in targets:
            part, rest = rest[: room[rank]], rest[room[rank] :]
            rows[rank] += part
            room[rank] -= len(part)
            load[rank] += weight(part)
            if not rest:
                break
    return rows


@dataclass
class Packed:
    """A micro-batch with each group's prompt once: the groups' sequences back to back in one row
    (no padding), each ``[prompt, reply_1, ..., reply_K]``.

    input_ids, position_ids: (1, tokens); allowed: (1, 1, tokens, tokens) bool, True where a query
    token may attend to a key token; index: (total_nnz,) for each token of verl's packed rows (row
    order, prompt + reply), its position in the shared row.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    allowed: torch.Tensor
    index: torch.Tensor

    @property
    def tokens(self) -> int:
        """Positions the forward runs."""
        return self.input_ids.shape[1]


def read_positions(offsets: torch.Tensor, prompt_lens: torch.Tensor) -> torch.Tensor:
    """(sum of reply lengths,) the positions of verl's packed per-row layout (row i at
    ``offsets[i]:offsets[i + 1]``) whose outputs a loss reads: each row's last prompt token and its
    reply but the last token, which predict the reply (``no_padding_2_padding``). The others (the
    prompt's predictions of itself) come out as zeros."""
    starts = (offsets[:-1] + prompt_lens - 1).tolist()
    return torch.cat([torch.arange(start, end) for start, end in zip(starts, (offsets[1:] - 1).tolist())]).to(offsets.device)


def pack(input_ids: torch.Tensor, position_ids: torch.Tensor, prompt_lens: torch.Tensor, groups: list[list[int]]) -> Packed:
    """Build the shared row of ``groups`` (row indices into the nested ``input_ids`` /
    ``position_ids`` of one micro-batch; every row in exactly one group).

    Segment 0 of a group is its prompt, segment j >= 1 its j-th reply; a query token may attend to
    a key token of its own group that is not after it and is in the prompt or in its own segment.
    """
    rows = input_ids.unbind()
    positions = position_ids.unbind()
    lens = [int(p) for p in prompt_lens.tolist()]
    ids, pos, seg, grp = [], [], [], []
    index: list[torch.Tensor | None] = [None] * len(rows)
    offset = 0
    for g, group in enumerate(groups):
        p = lens[group[0]]
        ids.append(rows[group[0]][:p])
        pos.append(positions[group[0]][:p])
        seg.append(torch.zeros(p, dtype=torch.long))
        prompt_at, offset = torch.arange(offset, offset + p), offset + p
        for j, row in enumerate(group, start=1):
            reply = rows[row][p:]
            index[row] = torch.cat([prompt_at, torch.arange(offset, offset + len(reply))])
            ids.append(reply)
            pos.append(positions[row][p:])
            seg.append(torch.full((len(reply),), j, dtype=torch.long))
            offset += len(reply)
        grp.append(torch.full((offset - int(prompt_at[0]),), g, dtype=torch.long))
    segment, group_of = torch.cat(seg), torch.cat(grp)
    same_group = group_of.unsqueeze(1) == group_of.unsqueeze(0)
    visible = (segment.unsqueeze(0) == 0) | (segment.unsqueeze(0) == segment.unsqueeze(1))
    allowed = torch.ones(offset, offset, dtype=torch.bool).tril() & same_group & visible
    device = input_ids.device
    return Packed(
        torch.cat(ids).unsqueeze(0).to(device),
        torch.cat(pos).unsqueeze(0).to(device),
        allowed.view(1, 1, offset, offset).to(device),
        torch.cat(index).to(device),
    )


class SharedPrefixFSDPEngine(FSDPEngineWithLMHead):
    """verl's FSDP engine with the shared-prefix forward (see the module docstring)."""

    share_prefix: bool = False  # set by the worker from ``SWITCH``
    _plain_reasons: set  # reasons already logged for running the plain path

    def _build_fsdp_module(self, module):
        """verl's, but on CPU a forward-only model (the reference for a KL term) is offloaded
        without pinned memory: verl asks FSDP2 for ``CPUOffloadPolicy(pin_memory=True)``, and
        pinning needs an accelerator ("Cannot access accelerator device")."""
        if transformer_impl.device_name != "cpu":
            return super()._build_fsdp_module(module)
        policy = transformer_impl.CPUOffloadPolicy
        with _swapped("CPUOffloadPolicy", lambda **kwargs: policy(**{**kwargs, "pin_memory": False})):
            return super()._build_fsdp_module(module)

    def _build_module(self):
        module = super()._build_module()
        if getattr(getattr(module, "config", None), "model_type", None) in VISION_MODEL_TYPES:
            fix_text_only_batches()  # verl's patched Qwen2-VL forward, for micro-batches without an image (vlm_compat.py)
        return module

    def _why_plain(self, data: TensorDict) -> str | None:
        """Why this batch cannot take the shared forward (None: it can)."""
        config = getattr(self.module, "config", None)
        attention = getattr(config, "_attn_implementation", None)
        if self.use_ulysses_sp:
            return "Ulysses sequence parallelism splits the packed sequence"
        if tu.get_non_tensor_data(data=data, key="distillation_use_topk", default=False):
            return "top-k distillation reads the teacher's tensors at every position of every row"
        if tu.get_non_tensor_data(data=data, key="use_fused_kernels", default=False):
            return "fused kernels do not return the logits the shared forward gathers"
        if self.pad_to_length:
            return "engine.pad_to_length pads the packed sequence to static lengths"
        if extract_multi_modal_inputs(data.get("multi_modal_inputs", [])):
            return "multi-modal rows"
        if data["position_ids"].dim() == 3:
            return "multi-axis (mrope) position ids"
        if "prompts" not in data.keys():
            return "the batch carries no prompts to find the groups by"
        sliding = getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True)
        if sliding or "sliding_attention" in (getattr(config, "layer_types", None) or ()):
            return "sliding-window attention (a custom mask would replace the window)"
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
            max_tokens = int(data["max_token_len_per_gpu"])
        else:  # never more tokens per forward than verl's own micro-batch of this many rows could hold
            max_tokens = int(data["micro_batch_size_per_gpu"]) * max(seq_lens)
        parts = partition(groups, prompt_lens.tolist(), seq_lens, max_tokens)
        count = torch.tensor(len(parts), device=transformer_impl.get_device_id())
        torch.distributed.all_reduce(count, op=torch.distributed.ReduceOp.MAX, group=self.get_data_parallel_group())
        return split_to(parts, int(count))

    def _all_ranks_share(self, data: TensorDict) -> bool:
        """Sharing on every data-parallel rank or on none: the two paths run different collectives."""
        flag = torch.tensor(int(self._sharing(data)), device=transformer_impl.get_device_id())
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MIN, group=self.get_data_parallel_group())
        return bool(flag)

    def forward_backward_batch(self, data: TensorDict, loss_function, forward_only=False):
        if not self.share_prefix or not self._all_ranks_share(data):
            return super().forward_backward_batch(data, loss_function, forward_only)
        parts = self._micro_batch_parts(data)
        self._shared_now, self._token_counts = True, [0, 0]
        try:
            with _micro_batches(parts):
                output = super().forward_backward_batch(data, loss_function, forward_only)
        finally:
            self._shared_now = False
        if not tu.get_non_tensor_data(data=data, key="use_dynamic_bsz", default=True):
            # verl restores the row order only after its own dynamic batching
            output["model_output"] = {k: restore_dynamic_batch(v, parts) for k, v in output["model_output"].items()}
        plain, shared = self._token_counts
        output["metrics"]["shared_prefix/token_frac"] = [shared / max(plain, 1)]
        return output

    def prepare_model_inputs(self, micro_batch: TensorDict):
        if ROW_TEMPERATURE in micro_batch.keys():
            micro_batch = _with_row_temperatures(micro_batch)
        positions = micro_batch["position_ids"]
        if positions.dim() == 3 and getattr(self.module.config, "vision_config", None) is None:
            # a text-only policy beside a vision-language one (L2): the agent loop laid every row's positions
            # out for multimodal RoPE, (text, time, height, width) per token; a text row's are its text axis
            micro_batch["position_ids"] = torch.nested.as_nested_tensor([row[0] for row in positions.unbind()], layout=torch.jagged)
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
        packed = pack(input_ids, micro_batch["position_ids"], prompt_lens, groups)
        self._token_counts[0] += plain
        self._token_counts[1] += packed.tokens
        mask = packed.allowed
        if self.module.config._attn_implementation == "eager":  # eager attention adds the mask to the scores
            mask = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device).masked_fill(~mask, torch.finfo(torch.float32).min)
        model_inputs = {"input_ids": packed.input_ids, "attention_mask": mask, "position_ids": packed.position_ids}
        read = read_positions(input_ids.offsets(), prompt_lens)
        heads, at = torch.unique(packed.index[read], return_inverse=True)
        if self._takes_logits_to_keep():  # the LM head only where a read log-prob is predicted
            model_inputs["logits_to_keep"] = heads
        else:
            at = heads[at]
        output_args["shared_prefix"] = (at, read, packed_view)
        return model_inputs, output_args

    def _takes_logits_to_keep(self) -> bool:
        if "_logits_to_keep" not in self.__dict__:
            model = getattr(self.module, "_fsdp_wrapped_module", self.module)  # FSDP1 wraps; FSDP2 keeps the class
            model = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft's
            self._logits_to_keep = "logits_to_keep" in inspect.signature(model.forward).parameters
        return self._logits_to_keep

    def prepare_model_outputs(self, output, output_args, micro_batch: TensorDict, logits_processor_func):
        shared = output_args.pop("shared_prefix", None)
        if shared is None:
            return super().prepare_model_outputs(output, output_args, micro_batch, logits_processor_func)
        # verl's log-probs, entropy, ... on the positions a loss reads (``read_positions``), each from
        # its group's sequence (the prompt's computed once), then back in verl's packed layout
        at, read, micro_batch = shared
        output.logits = output.logits[:, at]
        output_args["input_ids_rmpad_rolled"] = output_args["input_ids_rmpad_rolled"][read]
        output_args["temperature_rmpad"] = output_args["temperature_rmpad"][read]
        full_offsets = micro_batch["input_ids"].offsets()
        responses = full_offsets.diff() - prompt_lengths(micro_batch)
        reduced = micro_batch.copy()
        reduced["input_ids"] = torch.nested.nested_tensor_from_jagged(
            micro_batch["input_ids"].values()[read], torch.nn.functional.pad(responses.cumsum(0), (1, 0)))
        model_output = super().prepare_model_outputs(output, output_args, reduced, logits_processor_func)
        total = int(full_offsets[-1])
        for key, value in model_output.items():
            if isinstance(value, torch.Tensor) and value.is_nested:
                flat = value.values()
                model_output[key] = torch.nested.nested_tensor_from_jagged(
                    flat.new_zeros((total, *flat.shape[1:])).index_put((read,), flat), full_offsets)
        return model_output


def _with_row_temperatures(micro_batch: TensorDict) -> TensorDict:
    """The micro-batch with each row at the temperature it was sampled at (``ROW_TEMPERATURE``):
    verl's engine takes a (bsz,) temperature tensor; where every row shares one it gets the scalar,
    so verl keeps its shortcuts (no rescaled copy of the vocabulary-sized logits at 1, fused kernels)."""
    rows = micro_batch[ROW_TEMPERATURE]
    micro_batch = micro_batch.copy()
    if bool((rows == rows[0]).all()):
        tu.assign_non_tensor(micro_batch, temperature=float(rows[0]))
    else:
        del micro_batch["temperature"]
        micro_batch["temperature"] = rows
    return micro_batch


@contextlib.contextmanager
def _swapped(name: str, value):
    """``transformer_impl.<name>`` (a module-level name of verl's engine, where verl has no hook) is
    ``value`` for the duration of the block."""
    original = getattr(transformer_impl, name)
    setattr(transformer_impl, name, value)
    try:
        yield
    finally:
        setattr(transformer_impl, name, original)


def _micro_batches(parts: list[list[int]]):
    """verl's engine loop over our micro-batches of whole groups (for one ``forward_backward_batch`` call)."""
    return _swapped("prepare_micro_batches", lambda data, **_: ([tu.index_select_tensor_dict(data, part) for part in parts], parts))


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
