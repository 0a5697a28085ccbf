"""``pettingllms_sdpa_gqa``: transformers' SDPA attention that leaves grouped-query heads to torch under a mask too.

transformers' ``sdpa`` repeats K and V for every query head (``repeat_kv``) whenever an attention
mask is given, because CUDA's fused kernels do not take ``enable_gqa`` with a mask. The ``hf`` rollout
always has a mask when it batches (left padding, the shared-prefix layout), so on CPU every decode
step copied the whole KV cache of every layer (n_heads / n_kv_heads times over): with SmolLM2-135M,
32 rows and a 400-token cache, 260 of a 560 ms step. torch's CPU kernel takes ``enable_gqa`` with a
mask and gives the same numbers, so the CPU rollout registers this attention and loads the model
with it; CUDA keeps ``sdpa``.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.masking_utils import sdpa_mask

NAME = "pettingllms_sdpa_gqa"


def sdpa_gqa_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **_unused,
) -> tuple[torch.Tensor, None]:
    """query (bs, n_heads, q_len, head_dim), key/value (bs, n_kv_heads, kv_len, head_dim), mask
    (bs, 1, q_len, kv_len) bool or None -> (bs, q_len, n_heads, head_dim), as transformers' sdpa."""
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    is_causal = query.shape[2] > 1 and attention_mask is None and is_causal  # as transformers decides it
    output = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, is_causal=is_causal,
        enable_gqa=key.shape[1] != query.shape[1],
    )
    return output.transpose(1, 2).contiguous(), None


def register() -> str:
    """Register the attention and its mask (SDPA's) with transformers; returns the ``attn_implementation`` name."""
    AttentionInterface.register(NAME, sdpa_gqa_attention_forward)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    return NAME
