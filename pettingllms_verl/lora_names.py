"""Which LoRA adapter a peft tensor name belongs to, and how adapters travel through a checkpoint
engine: one rule for the trainer and the rollouts."""

from __future__ import annotations

import pickle
from typing import Any

import torch


def adapter_of(param_name: str) -> str | None:
    """The adapter a parameter belongs to: the name after peft's adapter-holding dict
    (``...q_proj.lora_A.<name>.weight``, ``...embed_tokens.lora_embedding_A.<name>``, DoRA's
    ``...lora_magnitude_vector.<name>.weight``); None for the base. peft's ``modules_to_save`` and
    trainable tokens (per-adapter copies of base tensors) belong to none."""
    parts = param_name.split(".")
    return next((adapter for holder, adapter in zip(parts, parts[1:]) if holder.startswith("lora_")), None)


# A checkpoint engine carries one stream of named tensors (mas_separate_async). The adapters a push
# refreshes travel in it under names of their own: each its peft config (a pickled dict, as bytes),
# then its tensors.
PUSHED_PREFIX = "pettingllms_adapter/"
CONFIG_NAME = "__peft_config__"


def pushed_name(adapter: str, name: str) -> str:
    """The name of an adapter's tensor (or of its config, ``CONFIG_NAME``) in a pushed stream."""
    return f"{PUSHED_PREFIX}{adapter}/{name}"


def config_tensor(config: Any) -> torch.Tensor:
    """A peft config (a mapping of LoraConfig fields) as a tensor of bytes, to travel among the weights."""
    return torch.frombuffer(bytearray(pickle.dumps(dict(config))), dtype=torch.uint8)


def split_pushed(named: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, tuple[dict, dict[str, torch.Tensor]]]]:
    """A pushed stream's tensors as (the base's, adapter -> (its peft config, its tensors))."""
    base: dict[str, torch.Tensor] = {}
    adapters: dict[str, tuple[dict, dict[str, torch.Tensor]]] = {}
    for name, tensor in named.items():
        if not name.startswith(PUSHED_PREFIX):
            base[name] = tensor
            continue
        adapter, _, key = name[len(PUSHED_PREFIX):].partition("/")
        config, tensors = adapters.setdefault(adapter, ({}, {}))
        if key == CONFIG_NAME:
            config.update(pickle.loads(tensor.numpy().tobytes()))
        else:
            tensors[key] = tensor
    return base, adapters
