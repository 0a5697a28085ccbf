"""The plugin's seams into verl's and vLLM's internals, named in one place and checked against the
installed versions.

verl 0.9.1 has public hooks for most of what the plugin adds (registries for trainers, estimators,
rollouts, engines, platforms and agent loops; callbacks), and the plugin uses them. What is left is
listed in ``SEAMS``: a private name read or written, a protected method overridden or called, a
module global swapped for the length of a call. Each entry says which upstream target it relies on,
the parameters the plugin passes or receives by name, where the plugin uses it, and why no public
hook serves. ``check`` resolves every target and compares its signature; ``register()`` runs it when
the installed verl lies outside ``VERIFIED`` and stops with one message naming each seam that no
longer matches, rather than a traceback from deep inside a worker. ``tests/test_compat.py`` runs it
on every suite run (the vLLM-side seams in the vLLM tier).
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from importlib import metadata

from packaging.version import Version

# the versions the seams were read from and verified on: [low, high)
VERIFIED = {"verl": ("0.9.1", "0.10"), "vllm": ("0.24", "0.25")}
READ_FROM = "verl 0.9.1, vLLM 0.24"


@dataclass(frozen=True)
class Seam:
    """One upstream internal the plugin relies on."""

    target: str  # "module:attr.attr": what is resolved
    params: tuple[str, ...] | None  # the parameters the plugin passes or receives by name (None: not a call)
    used_in: str  # the plugin's files that use it
    why: str  # what it replaces, and why no public hook serves
    needs_vllm: bool = False  # its module imports vLLM: checked where vLLM is installed


_TRAINER = "verl.trainer.ppo.v1.trainer_base:PPOTrainer."
_ENGINE = "verl.workers.engine.fsdp.transformer_impl:FSDPEngine."
_LM_HEAD = "verl.workers.engine.fsdp.transformer_impl:FSDPEngineWithLMHead."
_VLLM_SERVER = "verl.workers.rollout.vllm_rollout.vllm_async_server:vLLMHttpServer."
_STEP = "the mas_sync trainer's step: one batch per policy through verl's own per-batch methods (no public per-policy hook)"
_ENGINE_WHY = "a LoRA adapter per role in one FSDP2 actor / the shared-prefix forward: verl's engine has no hook for either"

SEAMS: tuple[Seam, ...] = (
    # the trainer (trainer/mas_trainer.py): verl's PPOTrainer with a batch per policy
    Seam(_TRAINER + "__init__", ("config",), "trainer/mas_trainer.py", "the trainer registered as mas_sync"),
    Seam(_TRAINER + "_build_replay_buffer", (), "trainer/mas_trainer.py", "the buffer's sample and poll wrapped (faults, dead workers)"),
    Seam(_TRAINER + "_init_resource_pool_mgr", (), "trainer/mas_trainer.py", "a resource pool per policy"),
    Seam(_TRAINER + "_setup", (), "trainer/mas_trainer.py", "a worker group, servers and checkpoint manager per policy"),
    Seam(_TRAINER + "_load_checkpoint", (), "trainer/checkpointing.py", "a checkpoint per policy"),
    Seam(_TRAINER + "_save_checkpoint", (), "trainer/checkpointing.py", "a checkpoint per policy"),
    Seam(_TRAINER + "get_llm_client", (), "trainer/mas_trainer.py", "the client that routes a role's requests to its policy"),
    Seam(_TRAINER + "_rollout_server_managers", (), "trainer/mas_trainer.py", "every policy's servers"),
    Seam(_TRAINER + "step", ("metrics", "timing_raw"), "trainer/mas_trainer.py", "a dead actor named in one message"),
    Seam(_TRAINER + "_step_once", ("metrics", "timing_raw", "sample_batch_size"), "trainer/mas_trainer.py", _STEP),
    Seam(_TRAINER + "_balance_batch", ("batch", "metrics", "logging_prefix", "keep_minibatch"), "trainer/batching.py", _STEP),
    Seam(_TRAINER + "_compute_old_log_prob", ("batch", "metrics"), "trainer/mas_trainer.py", _STEP),
    Seam(_TRAINER + "_compute_ref_log_prob", ("batch", "metrics"), "trainer/mas_trainer.py", _STEP),
    Seam(_TRAINER + "_compute_values", ("batch", "metrics"), "trainer/mas_trainer.py", _STEP),
    Seam(_TRAINER + "_compute_advantage", ("batch", "metrics"), "trainer/mas_trainer.py", "per-turn rewards and AT-GRPO groups; gae per policy"),
    Seam(_TRAINER + "_update_critic", ("batch", "metrics"), "trainer/batching.py", _STEP),
    Seam(_TRAINER + "_update_actor", ("batch", "metrics"), "trainer/batching.py", _STEP),
    Seam(_TRAINER + "_get_required_batch_multiple", ("dp_size",), "trainer/batching.py", _STEP),
    Seam(_TRAINER + "_compute_metrics", ("batch", "metrics", "timing_raw", "global_steps", "epoch"), "trainer/mas_trainer.py",
         "a failed episode's placeholder row counted as fresh"),
    Seam(_TRAINER + "_validate", (), "trainer/mas_trainer.py", "validation as trained and swapped (no public hook returns metrics)"),
    Seam(_TRAINER + "on_sample_begin", (), "trainer/mas_trainer.py", _STEP),
    Seam("verl.trainer.ppo.v1.trainer_sync:PPOTrainerSync.on_sample_end", (), "trainer/mas_trainer.py", _STEP),
    Seam("verl.trainer.ppo.v1.trainer_base:_count_tq_prompt_groups", ("partition_id",), "trainer/checkpointing.py",
         "an asynchronous run resumed from a checkpoint per policy counts its restored episodes as verl's own load does"),
    # verl's colocate_async schedule, its hooks taken as they are (trainer/mas_async.py): their bodies call
    # checkpoint_manager.{update_weights, abort_replicas, sleep_replicas, resume_generation_replicas}, which
    # MultiCheckpointManager provides over every policy
    *(Seam(f"verl.trainer.ppo.v1.trainer_colocate_async:PPOTrainerColocateAsync.{hook}", (), "trainer/mas_async.py",
           "verl's colocate_async hooks over every policy's replicas (the trainer's base is the sync one)")
      for hook in ("on_init_end", "on_train_begin", "on_sample_end", "on_step_end")),
    # verl's separate_async, run over every policy with rollout replicas of their own (trainer/mas_async.py)
    Seam("verl.trainer.ppo.v1.trainer_separate_async:PPOTrainerSeparateAsync.on_train_begin", (), "trainer/mas_async.py",
         "verl's separate_async warm-up as it is (the trainer's base is the sync one)"),
    Seam("verl.trainer.ppo.v1.trainer_separate_async:PPOTrainerSeparateAsync._enable_hybrid_replicas", None,
         "trainer/mas_trainer.py, trainer/mas_async.py", "read by verl's _setup and _init_resource_pool_mgr: no rollout in the trainer's processes"),
    *(Seam(f"verl.experimental.separation.engine_workers:DetachActorWorker.{method}", ("n",), "trainer/mas_async.py",
           "the rollout's weights restored for a step's later mini-batches (verl's experimental worker, mixed into the plugin's)")
      for method in ("save_model_to_cpu", "restore_model_from_cpu", "clear_cpu_model")),
    Seam("verl.checkpoint_engine.base:CheckpointEngine.build_topology", ("actor_wg_world_size", "rollout_world_size", "metadata"),
         "backends/cpu/weight_push.py", "public: the gloo checkpoint engine"),
    Seam("verl.checkpoint_engine.base:CheckpointEngineWorker.update_weights", ("global_steps",), "backends/hf/rollout.py",
         "a standalone hf replica receives its weights through verl's checkpoint engine worker"),
    Seam("verl.trainer.ppo.v1.replay_buffer:ReplayBuffer.sample", ("global_steps", "partition_id", "batch_size"), "trainer/mas_trainer.py",
         "faults counted per step before a batch is taken"),
    Seam("verl.trainer.ppo.v1.replay_buffer:ReplayBuffer._wait_for_next_poll", ("partition_id", "last_debug_time"), "trainer/mas_trainer.py",
         "a dead episode worker stops the run instead of a wait without end"),
    Seam("verl.single_controller.ray.base:get_master_addr_port", ("master_port_range",), "trainer/rendezvous.py",
         "rendezvous on the node of a policy's own pool"),
    # registries read or written by key (registration.py, preflight/training.py)
    Seam("verl.workers.rollout.base:_ROLLOUT_REGISTRY", None, "registration.py, preflight/training.py", "the rollouts' adapters by name: no register()"),
    Seam("verl.workers.rollout.replica:RolloutReplicaRegistry._registry", None, "registration.py", "idempotent registration"),
    Seam("verl.workers.rollout.replica:RolloutReplicaRegistry.register", ("name", "loader"), "registration.py", "public: the hf and multi-LoRA replicas"),
    Seam("verl.workers.engine:EngineRegistry._engines", None, "registration.py", "the FSDP engines also registered for cpu"),
    Seam("verl.workers.engine:EngineRegistry.register", ("model_type", "backend", "device"), "registration.py", "public"),
    Seam("verl.experimental.agent_loop.agent_loop:_agent_loop_registry", None, "registration.py",
         "the episode loop by dotted name, so that only the workers that run it import it"),
    Seam("verl.trainer.ppo.core_algos:ADV_ESTIMATOR_REGISTRY", None, "algo/at_grpo.py", "a reloaded at_grpo replaces its own entry"),
    # the hf rollout (backends/hf/rollout.py)
    Seam("verl.workers.rollout.replica:RolloutReplica.__init__", ("replica_rank", "config", "model_config"), "backends/hf/rollout.py",
         "the hf replica (one server per trainer rank)"),
    Seam("verl.workers.rollout.replica:RolloutReplica.launch_servers", (), "backends/hf/rollout.py", "the hf replica's server"),
    Seam("verl.workers.rollout.base:BaseRollout.__init__", ("config", "model_config", "device_mesh"), "backends/hf/rollout.py", "the hf adapter"),
    Seam("verl.workers.rollout.base:BaseRollout.update_weights", ("weights", "wire_format"), "backends/hf/rollout.py", "weights into the hf server"),
    # the agent-loop workers (rollout/worker.py)
    Seam("verl.experimental.agent_loop.agent_loop:AgentLoopWorker._run_agent_loop", ("sampling_params", "trajectory", "agent_name", "trace"),
         "rollout/worker.py", "validation episodes told apart from training ones"),
    Seam("verl.experimental.agent_loop.agent_loop:AgentLoopManager._init_agent_loop_workers", (), "rollout/worker.py",
         "the episode workers' class"),
    # the engines (trainer/multi_lora.py, trainer/shared_prefix.py, trainer/critic.py, trainer/vlm_compat.py)
    Seam(_ENGINE + "_build_lora_module", ("module",), "trainer/multi_lora.py", _ENGINE_WHY),
    Seam(_ENGINE + "_build_fsdp_module", ("module",), "trainer/multi_lora.py, trainer/shared_prefix.py", _ENGINE_WHY),
    Seam(_ENGINE + "_build_optimizer", ("module",), "trainer/multi_lora.py", "an optimizer group per adapter"),
    Seam(_ENGINE + "_build_lr_scheduler", ("optimizer",), "trainer/multi_lora.py", "a schedule per adapter group"),
    Seam(_ENGINE + "_build_module", (), "trainer/shared_prefix.py", _ENGINE_WHY),
    Seam(_ENGINE + "forward_backward_batch", ("data", "loss_function", "forward_only"), "trainer/shared_prefix.py", _ENGINE_WHY),
    Seam(_ENGINE + "lr_scheduler_step", (), "trainer/multi_lora.py", "a schedule per adapter group"),
    Seam(_ENGINE + "get_per_tensor_param", ("layered_summon", "base_sync_done"), "trainer/multi_lora.py", "one adapter's weights to the rollout"),
    Seam(_ENGINE + "save_checkpoint", ("local_path", "hdfs_path", "global_step", "max_ckpt_to_keep"), "trainer/multi_lora.py", "peft exports per adapter"),
    Seam(_ENGINE + "load_checkpoint", ("local_path", "hdfs_path", "del_local_after_load"), "trainer/multi_lora.py", "peft exports per adapter"),
    Seam(_LM_HEAD + "prepare_model_inputs", ("micro_batch",), "trainer/shared_prefix.py", _ENGINE_WHY),
    Seam(_LM_HEAD + "prepare_model_outputs", ("output", "output_args", "micro_batch", "logits_processor_func"), "trainer/shared_prefix.py",
         _ENGINE_WHY),
    Seam("verl.workers.engine.fsdp.transformer_impl:CPUOffloadPolicy", ("pin_memory",), "trainer/shared_prefix.py",
         "swapped for the length of one build: no pinned memory on CPU"),
    Seam("verl.workers.engine.fsdp.transformer_impl:prepare_micro_batches", ("data",), "trainer/shared_prefix.py",
         "swapped for the length of one call: a tree node's rows kept in one micro-batch"),
    Seam("verl.utils.fsdp_utils:_select_fsdp2_wrap_targets", ("model", "fsdp_transformer_layer_cls_to_wrap"), "trainer/multi_lora.py",
         "swapped for the length of one build: each adapter's modules wrapped apart (verl PR #7427 adds a parameter)"),
    Seam("verl.utils.fsdp_utils:collect_lora_params", ("module", "layered_summon", "base_sync_done"), "trainer/multi_lora.py", "one adapter's weights"),
    Seam("verl.utils.model:load_valuehead_model", ("local_path", "torch_dtype", "model_config", "trust_remote_code"), "trainer/critic.py",
         "swapped for the length of one build: a value head on CPU"),
    Seam("verl.models.transformers.qwen2_vl:_get_input_embeds",
         ("model", "input_ids", "attention_mask", "pixel_values", "pixel_values_videos", "image_grid_thw", "video_grid_thw"), "trainer/vlm_compat.py",
         "image rows' embeddings on CPU"),
    Seam("verl.workers.engine_workers:TrainingWorker.__init__", ("config",), "trainer/shared_prefix.py, trainer/multi_lora.py", _ENGINE_WHY),
    Seam("verl.workers.engine_workers:TrainingWorker.reset", (), "trainer/critic.py", "a value model per policy"),
    Seam("verl.workers.engine_workers:TrainingWorker.train_mini_batch", ("data",), "trainer/multi_lora.py", "the adapter a batch trains"),
    Seam("verl.workers.engine_workers:TrainingWorker.infer_batch", ("data",), "trainer/multi_lora.py", "the adapter a batch reads"),
    Seam("verl.workers.engine_workers:ActorRolloutRefWorker.init_model", (), "trainer/shared_prefix.py", _ENGINE_WHY),
    Seam("verl.workers.engine_workers:ActorRolloutRefWorker.update_weights", ("global_steps", "mode"), "trainer/multi_lora.py",
         "each adapter pushed to the rollout under its name"),
    # vLLM's servers through verl (backends/vllm_multilora.py): their modules import vLLM
    Seam(_VLLM_SERVER + "_get_worker_extension_cls", (), "backends/vllm_multilora.py", "adapters by name in vLLM's workers", True),
    Seam(_VLLM_SERVER + "run_server", ("args",), "backends/vllm_multilora.py", "vLLM started with LoRA enabled", True),
    Seam(_VLLM_SERVER + "run_headless", ("args",), "backends/vllm_multilora.py", "vLLM started with LoRA enabled", True),
    Seam(_VLLM_SERVER + "generate", ("prompt_ids", "sampling_params", "request_id"), "backends/vllm_multilora.py", "a request to its adapter", True),
    Seam(_VLLM_SERVER + "set_global_steps", ("global_steps",), "backends/vllm_multilora.py", "a weight version per adapter", True),
    Seam("verl.workers.rollout.vllm_rollout.vllm_async_server:vLLMReplica._get_server_name_prefix", (), "backends/vllm_multilora.py",
         "the multi-LoRA servers' names", True),
    Seam("verl.workers.rollout.vllm_rollout.vllm_rollout:ServerAdapter._get_server_name_prefix", (), "backends/vllm_multilora.py",
         "the multi-LoRA servers' names", True),
    Seam("verl.workers.rollout.vllm_rollout.vllm_rollout:ServerAdapter._ensure_server_handle", (), "backends/vllm_multilora.py",
         "the adapter's weights pushed to its server", True),
    Seam("verl.workers.rollout.vllm_rollout.vllm_rollout:ServerAdapter.update_weights", ("weights", "global_steps", "wire_format"),
         "backends/vllm_multilora.py", "the adapter's weights pushed to its server", True),
    Seam("verl.workers.rollout.vllm_rollout.utils:vLLMColocateWorkerExtension._update_weights", ("weights", "peft_config", "base_sync_done"),
         "backends/vllm_multilora.py", "each adapter loaded under its own name", True),
    Seam("verl.workers.rollout.vllm_rollout.utils:vLLMColocateWorkerExtension.update_weights_from_ipc",
         ("peft_config", "base_sync_done", "use_shm"), "backends/vllm_multilora.py", "each adapter loaded under its own name", True),
)


def resolve(target: str):
    """The object a seam's ``module:attr.attr`` names (raises ImportError or AttributeError where it moved)."""
    module, _, path = target.partition(":")
    found = importlib.import_module(module)
    for name in path.split("."):
        found = getattr(found, name)
    return found


def mismatch(seam: Seam) -> str | None:
    """Why ``seam`` no longer holds on the installed packages, in words (None: it holds)."""
    try:
        found = resolve(seam.target)
    except (ImportError, AttributeError) as error:
        return f"{seam.target} is gone ({type(error).__name__}: {error})"
    if seam.params is None:
        return None
    try:
        signature = inspect.signature(found)
    except (TypeError, ValueError):
        return f"{seam.target} is no longer a function or class"
    params = {name: p for name, p in signature.parameters.items() if name != "self"}
    open_ended = any(p.kind == p.VAR_KEYWORD for p in params.values())
    missing = [name for name in seam.params if name not in params and not open_ended]
    required = [name for name, p in params.items() if p.default is p.empty and name not in seam.params
                and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    if missing or required:
        return (f"{seam.target}{signature}: " + "; ".join(
            ([f"no parameter {', '.join(missing)}"] if missing else []) + ([f"now requires {', '.join(required)}"] if required else [])))
    return None


def check(with_vllm: bool | None = None) -> list[str]:
    """Every seam that no longer holds, in words; the vLLM-side ones only where vLLM is installed
    (``with_vllm``: None asks the installed packages)."""
    with_vllm = installed("vllm") is not None if with_vllm is None else with_vllm
    return [f"{problem} (used in {seam.used_in})" for seam in SEAMS
            if (with_vllm or not seam.needs_vllm) and (problem := mismatch(seam)) is not None]


def installed(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def outside_verified() -> dict[str, str]:
    """package -> its installed version, for verl and vLLM where installed outside ``VERIFIED``."""
    found = {}
    for package, (low, high) in VERIFIED.items():
        version = installed(package)
        if version is not None and not Version(low) <= Version(version) < Version(high):
            found[package] = version
    return found


def check_versions() -> str | None:
    """What ``register()`` says about the installed versions: None inside ``VERIFIED``; outside it, a
    warning when every seam still holds; raises ``RuntimeError`` naming each seam that does not."""
    outside = outside_verified()
    if not outside:
        return None
    found = ", ".join(f"{package} {version} (verified: >={VERIFIED[package][0]},<{VERIFIED[package][1]})" for package, version in outside.items())
    problems = check()
    if problems:
        raise RuntimeError(f"pettingllms_verl: installed {found}; {len(problems)} of the plugin's seams into its internals no longer "
                           "match (pettingllms_verl/compat.py):\n  " + "\n  ".join(problems)
                           + f"\nInstall a verified version (pip install 'verl>={VERIFIED['verl'][0]},<{VERIFIED['verl'][1]}'), "
                           "or report the seams above.")
    return f"pettingllms_verl: installed {found}, outside the versions its seams were verified on; every seam still matches"
