"""Batched token-in/token-out generation with transformers (the engine behind the ``hf`` rollout).

Device-agnostic: the same code serves a laptop CPU and a CUDA device. Concurrent requests that
share sampling settings are left-padded into one ``model.generate`` call; each result carries the
log-probabilities of its sampled tokens under ``log_softmax(logits / temperature)``, which is the
distribution verl's actor recomputes for its old log-probs.

Requests in one call share their prefill work: the longest common prefix of the prompts of one
adapter (the system prompt and rules every episode of a role starts with) is run once, and each
distinct prompt's rest once (the K branches of an AT-GRPO tree node are one prompt); the KV cache
is copied to each request, and every request then samples on its own.

The KV cache is preallocated for the whole reply (``_preallocated``): a growing cache copies
itself at every decode step.

Images (a vision-language model, e.g. Qwen2-VL): a request may carry its prompt's images as the
image processor's tensors (``pixel_values``, ``image_grid_thw``); the prompt holds their expanded
image tokens. A call with images runs the model's own ``generate`` over the whole prompts (its
vision tower and multimodal positions), without the shared prefill.

LoRA adapters (one per role, L1): ``load_adapter`` adds or refreshes a named peft adapter on the
one base model; a request names its adapter (None: the base), and requests with different
adapters still share one ``generate`` call (peft's ``adapter_names``, one per row). A call whose
rows all name one adapter runs it as peft's active adapter instead: the mixed-batch forward gathers
each adapter's rows in every adapted layer, ~25 % slower at 32 rows on CPU. With ``merge_adapters``
such a call runs the base model on weights with the adapter folded in (``W + scale * B @ A``, built
once per adapter refresh and swapped in for the call): no adapter matmuls in the decode loop (two per
adapted layer per step), at the memory of one copy of the adapted layers' weights per adapter.

Each ``generate`` ends by handing the memory it freed back to the system (glibc's ``malloc_trim``):
a call frees its KV cache and activations, and a refresh the folded weights, hundreds of MB to GB of
blocks that glibc's per-thread arenas would otherwise keep. Without it a CPU server's resident
memory grew with every step (to 4.0 GB against 1.8 GB in ten steps: benchmarks/RESULTS.md).
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from dataclasses import dataclass
from typing import Any
from collections.abc import Mapping

import torch
from peft import LoraConfig, PeftModel, get_peft_model, set_peft_model_state_dict
from peft.tuners.lora import Linear as LoraLinear
from transformers import Cache, PreTrainedModel, PreTrainedTokenizerBase, StaticCache

from pettingllms_verl.lora_names import adapter_of

BASE_ADAPTER = "__base__"  # peft's name for "no adapter" in a mixed-adapter batch
MIN_SHARED_PREFIX = 16  # tokens: a shorter common prefix is not worth a forward of its own
try:  # glibc's; elsewhere (musl, macOS) there is nothing to call and freed memory is the allocator's own business
    _MALLOC_TRIM = ctypes.CDLL(None).malloc_trim
except (AttributeError, OSError, TypeError):
    _MALLOC_TRIM = None


def release_freed_memory() -> None:
    """Return the allocator's free pages to the system (see the module docstring)."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


@dataclass(frozen=True)
class SamplingSpec:
    """One request's sampling settings, in verl's/vLLM's vocabulary."""

    max_tokens: int
    temperature: float = 1.0  # <= 0 means greedy
    top_p: float = 1.0
    top_k: int = -1  # -1 (or 0) disables top-k
    repetition_penalty: float = 1.0
    stop: tuple[str, ...] = ()  # generation ends after the first token that completes one of these

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0

    def batch_key(self) -> tuple:
        """Requests with equal keys can share one ``generate`` call (max_tokens may differ)."""
        return (self.temperature, self.top_p, self.top_k, self.repetition_penalty, self.stop)

    @classmethod
    def from_verl(cls, params: Mapping[str, Any], default_max_tokens: int) -> SamplingSpec:
        """Build from the ``sampling_params`` dict verl's agent loops send; caps ``max_tokens``."""
        max_tokens = params.get("max_tokens", params.get("max_new_tokens")) or default_max_tokens
        stop = params.get("stop") or ()
        if isinstance(stop, str):
            stop = (stop,)
        return cls(
            max_tokens=max(1, min(int(max_tokens), default_max_tokens)),
            temperature=float(params.get("temperature", 1.0)),
            top_p=float(params.get("top_p", 1.0)),
            top_k=int(params.get("top_k", -1) or -1),
            repetition_penalty=float(params.get("repetition_penalty", 1.0) or 1.0),
            stop=tuple(stop),
        )


@dataclass
class Generation:
    token_ids: list[int]
    log_probs: list[float]
    finish_reason: str  # "stop" (eos or stop string) or "length"


class _SampledTokenLogProbs:
    """Forward hook on the model during ``generate``: the log-prob of each sampled token under
    ``log_softmax(raw logits / temperature)``, kept one (bs,) row per step.

    ``output_logits=True`` would keep every step's full-vocabulary logits instead: bs x new tokens
    x vocab floats, tens of GB for a 150k vocabulary and 2k-token replies on a GPU. Each forward
    call of the decode loop receives the token sampled from the previous call's logits, so that
    call completes the previous step; the last step is completed by ``finish``.
    """

    def __init__(self, temperature: float):
        self.temperature = temperature
        self.pending: torch.Tensor | None = None  # (bs, vocab) log-probs of the step awaiting its token
        self.steps: list[torch.Tensor] = []

    def __call__(self, module: Any, args: tuple, kwargs: dict, output: Any) -> None:
        input_ids = kwargs["input_ids"] if "input_ids" in kwargs else args[0]
        if self.pending is not None:
            self._take(input_ids[:, -1])
        self.pending = torch.log_softmax(output.logits[:, -1].float() / self.temperature, dim=-1)

    def _take(self, tokens: torch.Tensor) -> None:
        self.steps.append(self.pending.gather(-1, tokens[:, None])[:, 0])
        self.pending = None

    def finish(self, new_tokens: torch.Tensor) -> torch.Tensor:
        """(bs, new_len) log-probs of ``new_tokens`` (bs, new_len), the tokens generate returned."""
        if self.pending is not None:
            self._take(new_tokens[:, -1])
        if len(self.steps) != new_tokens.shape[1]:  # e.g. a decoding strategy with several tokens per forward
            raise RuntimeError(f"hf engine: {len(self.steps)} forward steps for {new_tokens.shape[1]} new tokens")
        return torch.stack(self.steps, dim=1)


class HFGenerationEngine:
    """Owns one model copy (plus its LoRA adapters); thread-safe (generation and weight loading never overlap)."""

    def __init__(
        self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, max_batch_size: int = 64, share_prefill: bool = True,
        merge_adapters: bool = False,
    ):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.share_prefill = share_prefill  # one prefill per distinct (prompt, adapter) of a batch
        self.merge_adapters = merge_adapters  # a one-adapter call runs on weights with the adapter folded in
        self._folded_weights: dict[str, dict[torch.nn.Parameter, torch.Tensor] | None] = {}  # adapter -> folded weights (None: cannot fold)
        self.eos_token_ids = self._eos_token_ids(model, tokenizer)
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_token_ids[0]
        self._lock = threading.Lock()

    @staticmethod
    def _eos_token_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> list[int]:
        ids = model.generation_config.eos_token_id
        ids = [ids] if isinstance(ids, int) else list(ids or [])
        if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
            ids.append(tokenizer.eos_token_id)
        if not ids:
            raise ValueError("model has no eos_token_id (generation_config or tokenizer): cannot tell when to stop")
        return ids

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def base_model(self) -> PreTrainedModel:
        """The transformers model under any adapters: every decode step runs its forward
        (``PeftModel.generate`` calls the base's generate, so a hook on the PeftModel never fires)."""
        return self.model.get_base_model() if isinstance(self.model, PeftModel) else self.model

    @property
    def adapters(self) -> list[str]:
        return sorted(self.model.peft_config) if isinstance(self.model, PeftModel) else []

    def generate(
        self, prompts: list[list[int]], specs: list[SamplingSpec], adapters: list[str | None] | None = None,
        images: list[Mapping[str, torch.Tensor] | None] | None = None,
    ) -> list[Generation]:
        """Generate for many requests: grouped by sampling settings, chunked by ``max_batch_size``;
        ``adapters[i]`` is request i's LoRA adapter (None: the base model), ``images[i]`` its images
        as the image processor's tensors (None: none)."""
        adapters = list(adapters) if adapters is not None else [None] * len(prompts)
        images = list(images) if images is not None else [None] * len(prompts)
        unknown = sorted({a for a in adapters if a is not None} - set(self.adapters))
        if unknown:
            raise KeyError(f"hf engine: no adapter {unknown[0]!r} loaded; loaded: {self.adapters}")
        results: list[Generation | None] = [None] * len(prompts)
        groups: dict[tuple, list[int]] = {}
        for i, spec in enumerate(specs):
            groups.setdefault(spec.batch_key(), []).append(i)
        try:
            for members in groups.values():
                for start in range(0, len(members), self.max_batch_size):
                    chunk = members[start : start + self.max_batch_size]
                    outputs = self._generate_group(
                        [prompts[i] for i in chunk], [specs[i] for i in chunk], [adapters[i] for i in chunk], [images[i] for i in chunk]
                    )
                    for i, output in zip(chunk, outputs):
                        results[i] = output
        finally:
            release_freed_memory()
        return results

    @torch.no_grad()
    def _generate_group(
        self, prompts: list[list[int]], specs: list[SamplingSpec], adapters: list[str | None],
        images: list[Mapping[str, torch.Tensor] | None],
    ) -> list[Generation]:
        spec = specs[0]
        media = [row for row in images if row is not None]
        share = self.share_prefill and not media  # the shared prefill runs the text model alone
        cuts = self._prefix_cuts(prompts, adapters) if share else [0] * len(prompts)
        input_ids, attention_mask = self._layout(prompts, cuts)
        width = input_ids.shape[1]
        kwargs: dict[str, Any] = dict(
            max_new_tokens=max(s.max_tokens for s in specs),
            do_sample=not spec.greedy,
            eos_token_id=self.eos_token_ids,
            pad_token_id=self.pad_token_id,
            repetition_penalty=spec.repetition_penalty,
            disable_compile=True,  # a static cache would compile the forward on CUDA: a recompile per batch shape
        )
        if spec.greedy:  # unset sampling knobs so generation_config defaults cannot leak in
            kwargs.update(temperature=None, top_p=None, top_k=None)
        else:
            kwargs.update(temperature=spec.temperature, top_p=spec.top_p, top_k=spec.top_k if spec.top_k > 0 else 0)
        if spec.stop:
            kwargs.update(stop_strings=list(spec.stop), tokenizer=self.tokenizer)
        mixed = len(set(adapters)) > 1
        kwargs.update(self._adapter_kwargs(adapters, mixed))
        if media:  # in row order: the model fills each row's image tokens from these, one image after another
            joined = {key: torch.cat([row[key] for row in media]) for key in media[0]}
            kwargs.update({key: t.to(self.device, dtype=self.base_model.dtype if t.is_floating_point() else t.dtype) for key, t in joined.items()})
            # which columns are image tokens: the multimodal positions (M-RoPE) are computed from it
            kwargs.update(mm_token_type_ids=(input_ids == self.base_model.config.image_token_id).long().to(self.device))
        recorder = _SampledTokenLogProbs(1.0 if spec.greedy else spec.temperature)
        with self._lock, self._serving(adapters, mixed):
            # a multimodal model keeps its last call's position offsets (Qwen2-VL's rope_deltas, one per
            # row) for the decode steps that follow; a new call starts without them
            inner = getattr(self.base_model, "model", None)
            if getattr(inner, "rope_deltas", None) is not None:
                inner.rope_deltas = None
            cache = self._shared_prefill(prompts, adapters, mixed, cuts, input_ids, attention_mask) if share else None
            kwargs.update(past_key_values=self._preallocated(cache, width + kwargs["max_new_tokens"]))
            hook = self.base_model.register_forward_hook(recorder, with_kwargs=True)
            try:
                sequences = self.model.generate(
                    input_ids=input_ids.to(self.device), attention_mask=attention_mask.to(self.device), **kwargs
                )
            finally:
                hook.remove()
        new_tokens = sequences[:, width:]
        log_probs = recorder.finish(new_tokens).cpu()
        new_tokens = new_tokens.cpu()
        return [self._finish(new_tokens[row].tolist(), log_probs[row].tolist(), s) for row, s in enumerate(specs)]

    @staticmethod
    def _prefix_cuts(prompts: list[list[int]], adapters: list[str | None]) -> list[int]:
        """Per row, how many leading tokens it shares with every other row of its adapter: the
        longest common prefix of the adapter's prompts (all but the last token; 0 when shorter than
        ``MIN_SHARED_PREFIX`` or when the adapter has one row: nothing to share)."""
        members: dict[str | None, list[int]] = {}
        for row, adapter in enumerate(adapters):
            members.setdefault(adapter, []).append(row)
        cuts = [0] * len(prompts)
        for rows in members.values():
            if len(rows) < 2:
                continue
            first, shortest = prompts[rows[0]], min(len(prompts[row]) for row in rows)
            common = 0
            while common < shortest - 1 and all(prompts[row][common] == first[common] for row in rows):
                common += 1
            if common >= MIN_SHARED_PREFIX:
                for row in rows:
                    cuts[row] = common
        return cuts

    def _layout(self, prompts: list[list[int]], cuts: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows in two left-padded regions: each row's shared prefix (``cuts[row]`` tokens, right-aligned
        in the first ``max(cuts)`` columns), then the rest of its prompt (right-aligned at the end, so
        generation continues every row at the last column). All cuts 0: plain left padding. Position
        ids follow the mask (as ``generate`` derives them), so the holes change nothing."""
        split = max(cuts)
        width = split + max(len(p) - cut for p, cut in zip(prompts, cuts))
        input_ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, (prompt, cut) in enumerate(zip(prompts, cuts)):
            head, tail = prompt[:cut], prompt[cut:]
            if head:
                input_ids[row, split - cut : split] = torch.tensor(head, dtype=torch.long)
                attention_mask[row, split - cut : split] = 1
            input_ids[row, width - len(tail) :] = torch.tensor(tail, dtype=torch.long)
            attention_mask[row, width - len(tail) :] = 1
        return input_ids, attention_mask

    def _shared_prefill(self, prompts, adapters, mixed: bool, cuts, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        """The KV cache of every prompt column but the last (``generate`` runs that one: its logits
        are the first sampled token's), computing shared work once: each adapter's common prefix
        (the prefix region of ``_layout``) in one row per adapter, then the rest of each distinct
        (prompt, adapter) in one row each; the cache is copied to every row asking for it. None when
        nothing is shared (plain ``generate``)."""
        owner: dict[tuple, int] = {}
        rows = [owner.setdefault((tuple(prompt), adapter), len(owner)) for prompt, adapter in zip(prompts, adapters)]
        split, width = max(cuts), input_ids.shape[1]
        if not self.share_prefill or (split == 0 and len(owner) == len(prompts)) or width < 2:
            return None
        distinct = [rows.index(index) for index in range(len(owner))]
        mask = attention_mask[distinct].to(self.device)
        positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)  # as generate derives them from the mask
        cache = None
        if split:
            # one prefix row per adapter (rows without a shared prefix see none of it: masked)
            prefix_of: dict[str | None, int] = {}
            for row in distinct:
                if cuts[row]:
                    prefix_of.setdefault(adapters[row], row)
            heads = list(prefix_of.values())
            cache = self._forward(input_ids[heads, :split], attention_mask[heads, :split], [adapters[r] for r in heads], mixed)
            index = [heads.index(prefix_of.get(adapters[row], heads[0])) for row in distinct]
            cache.reorder_cache(torch.tensor(index, device=self.device))
        if width - 1 > split:
            cache = self._forward(
                input_ids[distinct, split : width - 1], mask[:, : width - 1], [adapters[r] for r in distinct], mixed,
                positions=positions[:, split : width - 1], cache=cache,
            )
        cache.reorder_cache(torch.tensor(rows, device=self.device))  # row i <- its (prompt, adapter)'s cache
        return cache

    def _preallocated(self, cache: Cache | None, length: int) -> StaticCache:
        """A KV cache with room for ``length`` columns holding ``cache`` (the shared prefill; None: empty).
        A growing cache copies itself at every decode step (``torch.cat``), ~85 ms of a ~220 ms step
        at 32 rows on the real model on CPU; this one is written in place (one row: no change)."""
        static = StaticCache(config=self.base_model.config.get_text_config(decoder=True), max_cache_len=length)
        if cache is not None:
            for layer, source in zip(static.layers, cache.layers):
                layer.update(source.keys, source.values)
        return static

    def _forward(self, ids: torch.Tensor, mask: torch.Tensor, adapters: list[str | None], mixed: bool, positions: torch.Tensor | None = None, cache=None):
        """A prefill forward (no logits beyond the last column); returns its KV cache."""
        mask = mask.to(self.device)
        if positions is None:
            positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
        kwargs: dict[str, Any] = dict(
            input_ids=ids.to(self.device), attention_mask=mask, position_ids=positions.to(self.device),
            past_key_values=cache, use_cache=True, logits_to_keep=1,
        )
        kwargs.update(self._adapter_kwargs(adapters, mixed))
        return self.model(**kwargs).past_key_values

    def _adapter_kwargs(self, adapters: list[str | None], mixed: bool) -> dict:
        """``adapter_names`` (one per row) for a forward in a call with several adapters (``mixed``);
        nothing in a call with one (``_serving`` activated it)."""
        return {"adapter_names": [a or BASE_ADAPTER for a in adapters]} if isinstance(self.model, PeftModel) and mixed else {}

    @contextlib.contextmanager
    def _serving(self, adapters: list[str | None], mixed: bool):
        """The adapter state of one call: several adapters (``mixed``) are named per row
        (``_adapter_kwargs``); one adapter runs folded into the base weights (``merge_adapters``) or as
        peft's active adapter; only the base runs with the adapters disabled."""
        if not isinstance(self.model, PeftModel) or mixed:
            yield
            return
        folded = self._folded(adapters[0]) if adapters[0] is not None and self.merge_adapters else None
        if adapters[0] is not None and folded is None:
            self.model.set_adapter(adapters[0])
            yield
            return
        originals = {weight: weight.data for weight in folded or ()}
        with self.model.disable_adapter():
            try:
                for weight, merged in (folded or {}).items():
                    weight.data = merged
                yield
            finally:
                for weight, original in originals.items():
                    weight.data = original

    def _folded(self, name: str) -> dict[torch.nn.Parameter, torch.Tensor] | None:
        """Adapter ``name`` folded into its layers' base weights: base weight -> ``W + scale * B @ A``
        (peft's ``get_delta_weight``, the delta its own merge adds), built on first use after a refresh.
        None, and the adapter runs as peft's active adapter, when a layer is not a plain LoRA linear (a
        variant such as DoRA, a LoRA bias, an embedding), its weight is tied to another module's (the
        swap would change both), or not fp32 (bf16 would round a young adapter's small delta away)."""
        if name not in self._folded_weights:
            folded: dict[torch.nn.Parameter, torch.Tensor] | None = {}
            seen: dict[int, int] = {}
            for _, parameter in self.model.named_parameters(remove_duplicate=False):
                seen[id(parameter)] = seen.get(id(parameter), 0) + 1
            for module in self.model.modules():
                if name not in getattr(module, "lora_A", {}) and name not in getattr(module, "lora_embedding_A", {}):
                    continue
                weight = getattr(module.get_base_layer(), "weight", None)
                if (type(module) is not LoraLinear or name in module.lora_variant or module.lora_bias[name]
                        or weight.dtype != torch.float32 or seen.get(id(weight), 0) > 1):
                    folded = None
                    break
                folded[weight] = weight.data + module.get_delta_weight(name).to(weight.dtype)
            self._folded_weights[name] = folded
        return self._folded_weights[name]

    def _finish(self, tokens: list[int], log_probs: list[float], spec: SamplingSpec) -> Generation:
        """Cut one row at its own end: eos (kept), a completed stop string (kept), or its max_tokens."""
        end, reason = min(len(tokens), spec.max_tokens), "length"
        for i, token in enumerate(tokens[:end]):
            if token in self.eos_token_ids:
                end, reason = i + 1, "stop"
                break
        if spec.stop:
            text = ""
            for i in range(end):
                text = self.tokenizer.decode(tokens[: i + 1])
                if any(s in text for s in spec.stop):
                    end, reason = i + 1, "stop"
                    break
        return Generation(token_ids=tokens[:end], log_probs=log_probs[:end], finish_reason=reason)

    def move_to(self, device: str) -> None:
        """Move the model (sleep/wake on CUDA); never in the middle of a generate or a weight load."""
        with self._lock:
            self.model.to(device)
            self._folded_weights.clear()

    def load_weights(self, named_tensors: Mapping[str, torch.Tensor]) -> int:
        """Copy trainer weights in place (HF parameter names); returns how many tensors were loaded.

        Every name must match a parameter or buffer of this model, and every parameter must be
        sent: a silent mismatch would leave the rollout sampling from stale weights (off-policy
        without anyone noticing).
        """
        # a LoRA-enabled trainer names adapted layers' weights `<layer>.base_layer.weight`
        named_tensors = {_base_name(name): tensor for name, tensor in named_tensors.items()}
        with self._lock, torch.no_grad():
            state = self._base_state()  # under the lock: a folded call swaps the adapted layers' tensors
            unknown = sorted(set(named_tensors) - set(state))
            if unknown:
                raise KeyError(f"hf rollout: {len(unknown)} weight names not in the rollout model, e.g. {unknown[:3]}")
            parameters = {_base_name(name) for name, _ in self.base_model.named_parameters() if "lora_" not in name}
            unsent = sorted(name for name in parameters if name not in named_tensors)
            if unsent:
                raise KeyError(f"hf rollout: the update leaves {len(unsent)} parameters stale, e.g. {unsent[:3]}")
            self._folded_weights.clear()  # folded into the old base weights
            for name, tensor in named_tensors.items():
                state[name].copy_(tensor.to(device=state[name].device, dtype=state[name].dtype))
        return len(named_tensors)

    def _base_state(self) -> dict[str, torch.Tensor]:
        """The base model's tensors under their transformers names (peft renames wrapped layers'
        weights to ``<layer>.base_layer.weight``; adapter tensors are left out)."""
        return {_base_name(name): t for name, t in self.base_model.state_dict().items() if adapter_of(name) is None}

    def load_adapter(self, name: str, named_tensors: Mapping[str, torch.Tensor], config: Mapping[str, Any]) -> int:
        """Add LoRA adapter ``name`` (peft ``LoraConfig`` fields in ``config``) or refresh its weights.

        ``named_tensors`` is the adapter alone, as ``peft.get_peft_model_state_dict`` gives it;
        every tensor of the adapter must be sent, and the base and the other adapters are untouched.
        """
        with self._lock, torch.no_grad():
            if not isinstance(self.model, PeftModel):
                self.model = get_peft_model(self.model, LoraConfig(**config), adapter_name=name)
            elif name not in self.model.peft_config:
                self.model.add_adapter(name, LoraConfig(**config))
            self._folded_weights.pop(name, None)  # folded from its old tensors (even if this update is refused below)
            own = {key for key in self.model.state_dict() if adapter_of(key) == name}
            result = set_peft_model_state_dict(self.model, dict(named_tensors), adapter_name=name)
            if result.unexpected_keys:
                raise KeyError(f"hf rollout: adapter {name!r}: unknown tensors, e.g. {sorted(result.unexpected_keys)[:3]}")
            stale = sorted(own & set(result.missing_keys))
            if stale:
                raise KeyError(f"hf rollout: adapter {name!r}: the update leaves {len(stale)} tensors stale, e.g. {stale[:3]}")
            self.model.eval()
        return len(named_tensors)


def _base_name(peft_name: str) -> str:
    return peft_name.replace(".base_layer.", ".")
