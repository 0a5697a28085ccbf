"""Which LoRA adapter a peft tensor name belongs to: one rule for the trainer and the rollouts."""

from __future__ import annotations


def adapter_of(param_name: str) -> str | None:
    """The adapter a parameter belongs to: the name after peft's adapter-holding dict
    (``...q_proj.lora_A.<name>.weight``, ``...embed_tokens.lora_embedding_A.<name>``, DoRA's
    ``...lora_magnitude_vector.<name>.weight``); None for the base. peft's ``modules_to_save`` and
    trainable tokens (per-adapter copies of base tensors) belong to none."""
    parts = param_name.split(".")
    return next((adapter for holder, adapter in zip(parts, parts[1:]) if holder.startswith("lora_")), None)
