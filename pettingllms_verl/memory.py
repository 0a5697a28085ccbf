"""A CPU run's memory, estimated before Ray starts: the hf rollout servers' KV caches for the rows
they batch at once, the model copies, and the processes.

On CPU every replica, trainer rank and Ray process shares the machine's memory, and a setting that
does not fit gets a process killed mid-run by Ray's memory monitor. The largest term, and the one a
setting moves, is the hf engine's KV cache: a ``generate`` call over R rows holds the prefill cache
(R x prompt tokens) and the preallocated cache it is copied into (R x (prompt + reply)) at once
(``backends/hf/engine.py``). That term, with the weights, reproduces what the engine measured alone
(``benchmarks/RESULTS.md``, "Evaluation memory"); the rest is counted coarsely (``PROCESS_BYTES``).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

GiB = 2**30
PROCESS_BYTES = GiB // 2  # one Ray process after importing torch and verl: ~550 MiB resident, part of it shared pages
FIXED_PROCESSES = 4  # the driver, verl's TaskRunner, the TransferQueue storage, the reward loop
RAY_MEMORY_THRESHOLD = 0.95  # Ray's memory monitor kills a worker past this share of the memory (RAY_memory_usage_threshold)
FP32 = 4


@dataclass(frozen=True)
class ModelSize:
    params: int
    kv_bytes_per_token: int  # keys and values of every layer for one token, at FP32

    @classmethod
    def of(cls, path: str) -> ModelSize:
        """From the model folder's config, on the meta device (no weights read)."""
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        config = AutoConfig.from_pretrained(path)
        with torch.device("meta"):
            params = sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())
        text = config.get_text_config()
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        kv_heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
        return cls(params, 2 * text.num_hidden_layers * kv_heads * head_dim * FP32)


@dataclass(frozen=True)
class Estimate:
    """A run's peak: ``fixed`` bytes (model copies, processes) and ``per_row`` more for each row its
    busiest servers batch at once (``rows``, prompts of up to ``prompt`` tokens, replies of ``reply``)."""

    fixed: int
    per_row: int
    rows: int
    prompt: int
    reply: int

    @property
    def need(self) -> int:
        return self.fixed + self.rows * self.per_row


def server_bytes(model: ModelSize, rows: int, prompt: int, reply: int, folded: int = 0) -> int:
    """One hf rollout server at its peak: the FP32 weights, the ``folded`` adapters' weights (each up
    to a copy of the model: the adapted layers' weights with the adapter folded in), the prefill cache
    of ``rows`` prompts and the preallocated cache for prompt + reply it is copied into."""
    return model.params * FP32 * (1 + folded) + rows * (2 * prompt + reply) * model.kv_bytes_per_token


def trainer_bytes(model: ModelSize, trainable: bool, reference: bool) -> int:
    """A policy's copies on its trainer ranks (FSDP shards them; the sum is what the machine holds):
    FP32 weights, and gradients and Adam's two moments when it trains; a reference copy for a KL term."""
    return model.params * FP32 * ((4 if trainable else 1) + (1 if reference else 0))


def rows_at_once(episodes: int, replicas: int, max_num_seqs: int) -> int:
    """Rows one server batches at its busiest: every episode's request at one turn, spread over the
    policy's replicas, at most the engine's batch (``rollout.max_num_seqs``)."""
    return max(1, min(max_num_seqs, math.ceil(episodes / replicas)))


def system_memory() -> int:
    """The memory this process may use: the machine's, or its cgroup's limit when lower (a container)."""
    import psutil

    total = psutil.virtual_memory().total
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
    except OSError:
        return total
    return min(total, int(limit)) if limit.isdigit() else total


def gib(n: float) -> str:
    return f"{n / GiB:.1f} GiB"


def usable(memory: int) -> int:
    return int(memory * float(os.environ.get("RAY_memory_usage_threshold", RAY_MEMORY_THRESHOLD)))
