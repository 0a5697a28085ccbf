"""verl V1 trainers ``mas_colocate_async`` and ``mas_separate_async``: verl's asynchronous schedules
over the table of policies (docs/async.md).

Everything a step does is ``mas_sync``'s (``trainer/mas_trainer.py``); what differs is verl's
schedule, taken from verl's own ``PPOTrainerColocateAsync`` and ``PPOTrainerSeparateAsync`` hooks
and run over every policy at once.

``mas_colocate_async`` (rollout and training share the devices):

    start: num_warmup_batches more prompts than a step trains go to the rollout
    sample: the step takes the first train_batch_size prompt groups that finish, whole
            (every row of a problem: each AT-GRPO group complete); the others play on
    then every policy's generation pauses (a request under way waits, or is continued, after the push)
    train each policy on its rows (as mas_sync)
    push every trainable policy's weights, resume generation, submit the next batch of prompts

``mas_separate_async`` (each policy's rollout replicas on a pool of their own, never paused to train):

    start: as above, from trainer.v1.separate_async.num_warmup_batches
    parameter_sync_step times: sample train_batch_size / parameter_sync_step prompt groups, whole,
        and train each policy on its rows; old log-probs from the weights its rollout has
        (verl's decoupled PPO: the weights at the step's start, restored for the step's later
        mini-batches) unless rollout correction bypasses them
    push each trainable policy's weights to its own replicas (checkpoint engine ``gloo`` on CPU:
        backends/cpu/weight_push.py); only that policy's generation waits for its push

So a step never waits for its slowest episode: an episode that straddles a push goes on with the
new weights, a reply sampled before it keeps its version (each row records the versions of its
role's replies; verl's ``trainer.v1.sampler.max_off_policy_threshold`` bounds how old a group's
weights may be, checked per row in ``_check_versions``), and a tree node whose K branches came from
two versions is sampled again (``rollout/agent_loop.py``).
"""

from __future__ import annotations

from verl.checkpoint_engine import CheckpointEngineManager
from verl.experimental.separation.engine_workers import DetachActorWorker
from verl.single_controller.base.decorator import Dispatch, register
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_colocate_async import PPOTrainerColocateAsync
from verl.trainer.ppo.v1.trainer_separate_async import PPOTrainerSeparateAsync
from verl.utils.config import omega_conf_to_dataclass
from verl.utils.debug import marked_timer
from verl.workers.rollout.llm_server import FullyAsyncLLMServerClient, LLMServerManager

from pettingllms_verl.trainer.mas_trainer import MASTrainer
from pettingllms_verl.trainer.multi_lora import MultiLoRAActorRolloutRefWorker
from pettingllms_verl.trainer.shared_prefix import SharedPrefixActorRolloutRefWorker


@register_trainer("mas_colocate_async")
class MASColocateAsyncTrainer(MASTrainer):
    mode = "mas_colocate_async"
    llm_client_cls = FullyAsyncLLMServerClient  # continues a request a server aborted, after the weight push
    # verl's colocate_async hooks as they are, over MultiCheckpointManager (every policy's replicas)
    on_init_end = PPOTrainerColocateAsync.on_init_end
    on_train_begin = PPOTrainerColocateAsync.on_train_begin
    on_sample_end = PPOTrainerColocateAsync.on_sample_end
    on_step_end = PPOTrainerColocateAsync.on_step_end


class HostCopies(DetachActorWorker):
    """verl's save/restore of a trainer's weights to host memory (``DetachActorWorker``), for the
    plugin's workers: the old log-probs of a step's later mini-batches come from the weights its
    rollout had."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_model_to_cpu(self, n):
        # verl's FSDP2 save takes each shard's .cpu(), which is the shard itself where the model
        # lives on the CPU: the saved weights would follow every update. A copy keeps them.
        super().save_model_to_cpu(n)
        saved = self.cpu_saved_models[n]
        on_cpu = any(param.device.type == "cpu" for param in self.actor.engine.module.parameters())
        if on_cpu and isinstance(saved, tuple):  # FSDP2's (shards by name, the mesh's spec)
            shards, spec = saved
            self.cpu_saved_models[n] = ({name: (shard.clone(), shard_spec) for name, (shard, shard_spec) in shards.items()}, spec)


class DetachedSharedPrefixWorker(SharedPrefixActorRolloutRefWorker, HostCopies):
    """A full-model group's trainer ranks under mas_separate_async."""


class DetachedMultiLoRAWorker(MultiLoRAActorRolloutRefWorker, HostCopies):
    """The adapter group's trainer ranks under mas_separate_async."""


@register_trainer("mas_separate_async")
class MASSeparateAsyncTrainer(MASTrainer):
    mode = "mas_separate_async"
    llm_client_cls = FullyAsyncLLMServerClient
    _enable_hybrid_replicas = False  # verl's separate_async with actor_rollout_ref.hybrid_engine=False
    full_model_worker = DetachedSharedPrefixWorker
    adapter_worker = DetachedMultiLoRAWorker
    # verl's separate_async warm-up as it is (the other hooks serve its hybrid replicas, which this mode has none of)
    on_train_begin = PPOTrainerSeparateAsync.on_train_begin

    def _first_rollout(self) -> tuple[LLMServerManager, CheckpointEngineManager]:
        return self._rollout(self.config, self.actor_rollout_wg, None)

    def _rollout(self, config, worker_group, pool) -> tuple[LLMServerManager, CheckpointEngineManager]:
        """A group's standalone rollout replicas (verl's ``init_standalone``: a resource pool of their
        own of ``rollout.nnodes`` x ``rollout.n_gpus_per_node``) and the checkpoint engine that pushes
        its trainer's weights to them (``rollout.checkpoint_engine.backend``). Replica ranks run on
        over the groups: verl names each replica's pool and workers by its rank."""
        start = sum(len(group.servers.get_replicas()) for group in self.groups.values())
        servers = LLMServerManager.create(config=config, start_rank=start)
        sync_config = omega_conf_to_dataclass(config.actor_rollout_ref.rollout.checkpoint_engine)
        return servers, CheckpointEngineManager(config=sync_config, actor_wg=worker_group, replicas=servers.get_replicas())

    def on_step_begin(self):
        # the weights each rollout has now (pushed at the last step's end): the old policy of this
        # step's later mini-batches (verl's decoupled PPO, per policy)
        if self._decoupled():
            for group in self.groups.values():
                if group.trainable:
                    group.worker_group.save_model_to_cpu(0)

    def on_sample_end(self):
        return None  # the rollout never pauses to train

    def on_step_end(self):
        with marked_timer("update_weights", self.timing_raw, color="red"):
            self._pending_sync_metrics = self.checkpoint_manager.update_weights(self.global_steps) or {}

    def _decoupled(self) -> bool:
        """Old log-probs recomputed from the rollout's weights when a step updates more than once
        before its push (verl's decoupled PPO); rollout correction's bypass takes the rollout's own."""
        correction = self.config.algorithm.get("rollout_correction", None)
        return self.parameter_sync_step > 1 and not (correction and correction.get("bypass_mode", False))

    def _compute_old_log_prob(self, batch, metrics: dict):
        """verl's separate_async old log-probs (``PPOTrainerSeparateAsync._compute_old_log_prob``), for
        the policy ``_serving`` points at: its mini-batches after the first are scored with the
        weights saved at the step's start, then its current weights come back."""
        if not self._decoupled() or self.local_trigger_step == 0:
            return super()._compute_old_log_prob(batch, metrics)
        workers, current = self.actor_rollout_wg, self.local_trigger_step
        workers.save_model_to_cpu(current)
        workers.restore_model_from_cpu(0)
        try:
            return super()._compute_old_log_prob(batch, metrics)
        finally:
            workers.restore_model_from_cpu(current)
            workers.clear_cpu_model(current)
