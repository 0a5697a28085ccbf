"""Everything the plugin adds to verl, registered through verl's own registries.

Heavy modules are registered by dotted name wherever verl allows it, so importing verl stays
fast in processes that never use them.
"""

from __future__ import annotations

import logging
import sys

logger = logging.getLogger(__name__)

_HF_ADAPTER = "pettingllms_verl.backends.hf.rollout.HFServerAdapter"
_EPISODE_LOOP = "pettingllms_verl.rollout.agent_loop.EpisodeAgentLoop"

_registered = False


def _load_hf_replica():
    from pettingllms_verl.backends.hf.rollout import HFRolloutReplica

    return HFRolloutReplica


def _register_cpu_engines() -> None:
    """verl's FSDP engines run on CPU as they are; they are only registered for cuda/npu."""
    from verl.workers.engine import EngineRegistry, FSDPEngineWithLMHead
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithValueHead

    for model_type, engine in (("language_model", FSDPEngineWithLMHead), ("value_model", FSDPEngineWithValueHead)):
        if "cpu" not in EngineRegistry._engines.get(model_type, {}).get("fsdp2", {}):
            EngineRegistry.register(model_type=model_type, backend=["fsdp", "fsdp2"], device="cpu")(engine)


def _check() -> list[str]:
    """Names of registrations that are missing (empty when all is well)."""
    from verl.plugin.platform import PlatformRegistry
    from verl.workers.engine import EngineRegistry
    from verl.workers.rollout.base import _ROLLOUT_REGISTRY
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
    from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY
    from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY

    from verl.checkpoint_engine import CheckpointEngineRegistry

    from pettingllms_verl.backends import vllm_multilora
    from pettingllms_verl.backends.cpu import weight_push
    from pettingllms_verl.data.rows import EPISODE_AGENT
    from pettingllms_verl.config import TRAINER_MODES

    missing = []
    if "at_grpo" not in ADV_ESTIMATOR_REGISTRY:
        missing.append("advantage estimator 'at_grpo'")
    if _agent_loop_registry.get(EPISODE_AGENT, {}).get("_target_") != _EPISODE_LOOP:
        missing.append(f"agent loop '{EPISODE_AGENT}'")
    missing.extend(f"V1 trainer '{mode}'" for mode in TRAINER_MODES if mode not in TRAINER_REGISTRY)
    if PlatformRegistry.get("cpu") is None:
        missing.append("verl platform 'cpu'")
    if "hf" not in RolloutReplicaRegistry._registry:
        missing.append("rollout replica 'hf'")
    if _ROLLOUT_REGISTRY.get(("hf", "async")) != _HF_ADAPTER:
        missing.append("rollout adapter ('hf', 'async')")
    if vllm_multilora.ROLLOUT_NAME not in RolloutReplicaRegistry._registry:
        missing.append(f"rollout replica '{vllm_multilora.ROLLOUT_NAME}'")
    if _ROLLOUT_REGISTRY.get((vllm_multilora.ROLLOUT_NAME, "async")) != vllm_multilora.SERVER_ADAPTER:
        missing.append(f"rollout adapter ('{vllm_multilora.ROLLOUT_NAME}', 'async')")
    try:
        CheckpointEngineRegistry.get(weight_push.BACKEND)
    except ValueError:
        missing.append(f"checkpoint engine '{weight_push.BACKEND}'")
    if "cpu" not in EngineRegistry._engines["language_model"]["fsdp2"]:
        missing.append("FSDP engine for device 'cpu'")
    return missing


def _own_import_in_progress() -> bool:
    """True while one of this package's modules is mid-import: it imported verl, whose plugin hook
    called us back. Registering now would import that half-built module (a circular import)."""
    return any(
        getattr(getattr(module, "__spec__", None), "_initializing", False)
        for name, module in list(sys.modules.items())
        if name.startswith("pettingllms_verl.") and name not in ("pettingllms_verl.plugin", "pettingllms_verl.registration")
    )


def register() -> None:
    """Register the plugin with verl; idempotent; raises (and prints) if anything is missing.

    When verl is first imported by one of this package's own modules (``import
    pettingllms_verl.algo`` in a fresh interpreter), the hook returns without registering; the
    next call (the preflight, a verl process's own plugin load, a test) registers everything.
    """
    global _registered
    if _registered or _own_import_in_progress():
        return
    try:
        from pettingllms_verl import compat

        said = compat.check_versions()  # outside the verified versions: each seam that moved, in one message
        if said:
            logger.warning(said)
        import pettingllms_verl.backends.cpu.platform  # noqa: F401  (registers platform "cpu")
        import pettingllms_verl.backends.cpu.weight_push  # noqa: F401  (registers checkpoint engine "gloo")
        from pettingllms_verl.backends import vllm_multilora
        from verl.workers.rollout.base import _ROLLOUT_REGISTRY
        from verl.workers.rollout.replica import RolloutReplicaRegistry

        RolloutReplicaRegistry.register("hf", _load_hf_replica)
        _ROLLOUT_REGISTRY[("hf", "async")] = _HF_ADAPTER
        vllm_multilora.register()
        _register_cpu_engines()
        import pettingllms_verl.algo  # noqa: F401  (registers advantage estimator "at_grpo")
        import pettingllms_verl.trainer.mas_async  # noqa: F401  (registers V1 trainers "mas_sync", "mas_colocate_async", "mas_separate_async")
        from verl.experimental.agent_loop.agent_loop import _agent_loop_registry

        from pettingllms_verl.data.rows import EPISODE_AGENT

        # By dotted name: the loop's module is imported only in agent-loop workers that run it.
        _agent_loop_registry[EPISODE_AGENT] = {"_target_": _EPISODE_LOOP}
        missing = _check()
        if missing:
            raise RuntimeError("registrations missing after register(): " + ", ".join(missing))
    except Exception as error:
        # verl hides plugin import errors; make sure this one is seen.
        print(f"pettingllms_verl: plugin registration FAILED: {error!r}", file=sys.stderr, flush=True)
        raise
    _registered = True
