"""verl's FSDP2 language-model engine in this process (one gloo rank): what a verl worker builds,
without Ray, for equivalence tests and benchmarks of the engine's forward and update."""

from __future__ import annotations

import os
import socket

import torch


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def local_engine(model_path: str, engine_cls: type | None = None, attn_implementation: str = "sdpa", lr: float = 1e-5, adapters: dict | None = None):
    """verl's engine (``EngineRegistry.new`` + ``initialize()``) on ``model_path``, fp32, as class
    ``engine_cls`` (swapped in before the model is built, as our training workers do); ``adapters``:
    the LoRA adapter table of ``MultiLoRAFSDPEngine`` (``config.adapter_table``'s format)."""
    import torch.distributed as dist

    from pettingllms_verl.registration import register

    register()  # the CPU platform, before verl resolves its device
    from verl.plugin.platform import get_platform, set_platform

    if not get_platform().is_available():
        # verl resolved its platform in this process before the plugin registered (it then falls
        # back to 'nvidia'); without an accelerator the CPU platform is the one that runs
        from pettingllms_verl.backends.cpu.platform import PlatformCPU

        set_platform(PlatformCPU())
    from verl.trainer.config import CheckpointConfig
    from verl.workers.config import FSDPEngineConfig, FSDPOptimizerConfig, HFModelConfig
    from verl.workers.engine import EngineRegistry

    from pettingllms_verl.config import ADAPTERS_KEY

    if not dist.is_initialized():
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
        dist.init_process_group("gloo", rank=0, world_size=1)
    fp32 = {"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}
    engine = EngineRegistry.new(
        model_type="language_model",
        backend="fsdp2",
        model_config=HFModelConfig(
            path=model_path,
            override_config={"attn_implementation": attn_implementation},
            **({"lora_rank": max(spec["r"] for spec in adapters.values()), "lora": {ADAPTERS_KEY: adapters}} if adapters else {}),
        ),
        engine_config=FSDPEngineConfig(strategy="fsdp2", mixed_precision=fp32),
        optimizer_config=FSDPOptimizerConfig(lr=lr),
        checkpoint_config=CheckpointConfig(),
    )
    if engine_cls is not None:
        engine.__class__ = engine_cls
    engine.initialize()
    return engine


def no_padding_batch(prompts: list[list[int]], replies: list[list[int]], **meta):
    """A verl no-padding batch as the trainer builds it (left-padded prompts, right-padded
    replies, then ``left_right_2_no_padding``), with ``meta`` as non-tensor settings."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding

    n, max_p, max_r = len(prompts), max(map(len, prompts)), max(map(len, replies))
    prompt_ids = torch.zeros(n, max_p, dtype=torch.long)
    response_ids = torch.zeros(n, max_r, dtype=torch.long)
    attention = torch.zeros(n, max_p + max_r, dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompts, replies, strict=True)):
        prompt_ids[i, max_p - len(p) :] = torch.tensor(p)
        response_ids[i, : len(r)] = torch.tensor(r)
        attention[i, max_p - len(p) : max_p + len(r)] = 1
    batch = tu.get_tensordict(
        {
            "prompts": prompt_ids,
            "responses": response_ids,
            "input_ids": torch.cat([prompt_ids, response_ids], dim=1),
            "attention_mask": attention,
            "response_mask": attention[:, max_p:],
            "position_ids": (attention.cumsum(-1) - 1).clamp(min=0),
        }
    )
    batch = left_right_2_no_padding(batch)
    defaults = dict(temperature=1.0, calculate_entropy=True, use_fused_kernels=False, use_dynamic_bsz=False,
                    micro_batch_size_per_gpu=4, max_token_len_per_gpu=10_000, global_batch_size=n)
    tu.assign_non_tensor(batch, **{**defaults, **meta})
    return batch
