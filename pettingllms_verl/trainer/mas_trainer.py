"""verl V1 trainer ``mas_sync``: verl's synchronous trainer over a table of policies.

Select it with ``trainer.v1.trainer_mode=mas_sync``. The policies of ``pettingllms.policies`` (one
``shared`` policy when none is listed: L0) live in worker groups, each with its own rollout
replicas and weight sync (``trainer/policies.py``): a full-model policy is a group of its own (L2);
the LoRA-adapter policies share one group on the base model, an adapter each (L1,
``trainer/multi_lora.py``). A step reads top to bottom:

    rollout (each role's requests go to its policy's replicas [and adapter])
    -> per policy: pad its own rows, old log-probs [+ ref] on its group [with its adapter active]
       [+ values from its critic (gae)]
    -> one advantage pass over all rows (an AT-GRPO group never spans two policies; gae: one per policy)
    -> per trainable policy: [update its critic,] update its actor on its own rows
    -> weight sync of every trainable policy (strictly on-policy: checked per policy next step)

It adds the ``mas/``, ``at_grpo/`` and ``policy/<name>/`` metrics, a checkpoint per policy, the
swapped-policy validation switch and a fixed number of optimizer steps per training step.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import time
from collections import defaultdict
from functools import partial

import numpy as np
import ray
import torch
import transfer_queue as tq
from omegaconf import OmegaConf, open_dict
from tensordict import TensorDict
from transfer_queue import KVBatchMeta
from verl.checkpoint_engine import CheckpointEngineManager
from verl.single_controller.ray import RayClassWithInitArgs, RayWorkerGroup, ResourcePoolManager, create_colocated_worker_cls
from verl.plugin.platform import get_platform
from verl.trainer.ppo.core_algos import AdvantageEstimator
from verl.trainer.ppo.utils import Role
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.utils.config import omega_conf_to_dataclass
from verl.utils.debug import marked_timer
from verl.utils.tensordict_utils import list_of_dict_to_tensordict
from verl.workers.engine_workers import TrainingWorkerConfig
from verl.workers.rollout.llm_server import LLMServerManager
from verl.workers.utils.losses import value_loss

from pettingllms_verl.algo import AT_GRPO, group_stats, permute_within_groups, zero_variance_frac
from pettingllms_verl.checkpoints import VAL_METRICS, step_folder
from pettingllms_verl.config import ADAPTER_GROUP, NULL_REWARD_PERMUTE, ROW_TEMPERATURE, SECTION, TRAINER_MODES, load, policy_config
from pettingllms_verl.episodes.tags import SWAPPED_KWARG
from pettingllms_verl.files import write_whole
from pettingllms_verl.placement import PLACEMENT, name_actors, named_by_ray, nodes_of, refusal, who
from pettingllms_verl.rollout.codecs import MODELS_KEY, tokenizer_source
from pettingllms_verl.rollout.faults import STOPPED, FaultTally, RunStopped
from pettingllms_verl.trainer import rendezvous
from pettingllms_verl.trainer.batching import PolicyBatching, check_groups_within_policies
from pettingllms_verl.trainer.checkpointing import PolicyCheckpoints
from pettingllms_verl.trainer.critic import ValueModelWorker
from pettingllms_verl.trainer.metrics import episode_metrics, explained_variance, lag, policy_metrics, staleness
from pettingllms_verl.trainer.multi_lora import ADAPTER_KEY, MultiLoRAActorRolloutRefWorker
from pettingllms_verl.trainer.policies import MultiCheckpointManager, PolicyGroup, PolicyRouterClient
from pettingllms_verl.trainer.shared_prefix import SharedPrefixActorRolloutRefWorker

TRAINER_MODE = "mas_sync"
ACTOR_ROLES = (Role.ActorRollout, Role.ActorRolloutRef, Role.Actor)  # Actor: without rollout replicas of its own (separate_async)
WORKER_CHECK_S = 10.0  # while waiting for episodes: how often the agent-loop workers are asked whether they live


def _with_column(batches, name: str, value):
    """The batches of a dataloader, each with one more per-row column (the agent loop's kwargs)."""
    for batch in batches:
        batch[name] = np.full(len(batch["raw_prompt"]), value, dtype=object)
        yield batch


@register_trainer(TRAINER_MODE)
class MASTrainer(PolicyCheckpoints, PolicyBatching, PPOTrainerSync):
    mode = TRAINER_MODE  # its trainer.v1.trainer_mode
    llm_client_cls = None  # verl's client class of the mode's schedule (None: verl's plain one)
    # verl reads it (compat.py): rollout replicas in the trainer's processes, asleep while it trains
    _enable_hybrid_replicas = True
    full_model_worker = SharedPrefixActorRolloutRefWorker  # a full-model group's trainer ranks
    adapter_worker = MultiLoRAActorRolloutRefWorker  # the adapter group's

    def __init__(self, config):
        self.settings = load(config.get(SECTION))
        self.policy_table = self.settings.policy_table()
        self.group_policies = self.settings.groups()  # group -> its policies; the adapters' group first
        self.group_of = {policy: group for group, names in self.group_policies.items() for policy in names}
        self.first_group = next(iter(self.group_policies))
        if self.first_group != ADAPTER_GROUP and self.policy_table[self.first_group].pool != "shared":
            raise ValueError(
                f"{SECTION}.policies.{self.first_group}.pool: the first policy runs on the trainer's GPUs; "
                "list a pool=shared policy first"
            )
        # The first group is verl's own actor group: its settings go into the main config. The
        # others start from actor_rollout_ref as configured, never from the first group's.
        self._configured_actor_rollout_ref = copy.deepcopy(config.actor_rollout_ref)
        # each group's model section, for the episode workers: a policy of another model family renders its own prompts
        # (without verl's _target_: the rollout config is instantiated in every worker, and these must stay data there)
        views = {group: policy_config(config, group).actor_rollout_ref for group in self.group_policies}
        models = {group: {key: value for key, value in OmegaConf.to_container(view.model, resolve=True).items() if key != "_target_"}
                  for group, view in views.items()}
        with open_dict(config):
            config.actor_rollout_ref = views[self.first_group]
            config.actor_rollout_ref.rollout.custom[MODELS_KEY] = models
        self.groups: dict[str, PolicyGroup] = {}
        rendezvous.install()  # before verl's _setup creates the first worker group
        super().__init__(config)

    @property
    def trainer_mode(self) -> str:
        # Registered under its own name, but every "is this the sync trainer?" check in verl
        # (replay buffer, refill, checkpointed episodes) and its trainer.v1.<mode> section must see
        # the schedule it runs.
        return TRAINER_MODES[self.mode]

    @trainer_mode.setter
    def trainer_mode(self, _configured_name: str) -> None:
        pass

    def _build_replay_buffer(self):
        # verl's buffer polls for finished episodes every 2 s (not configurable there); on a CPU
        # step of ~3 s that sleep dominates `timing_s/gen`.
        buffer = super()._build_replay_buffer()
        if self.settings.trainer.replay_poll_interval_s is not None:
            buffer.poll_interval = float(self.settings.trainer.replay_poll_interval_s)
        # Every batch of episodes, training or validation, passes the fault check before anything
        # uses it: the one place both of verl's loops take finished episodes from.
        sample = buffer.sample

        def checked_sample(*, global_steps, partition_id, batch_size):
            batch, metrics = sample(global_steps=global_steps, partition_id=partition_id, batch_size=batch_size)
            self._check_faults(batch, partition_id)
            return batch, metrics

        buffer.sample = checked_sample
        # verl dispatches episodes to its agent-loop workers and polls for their rows: a worker that
        # died (killed, or on a lost node) never sends them, and the poll would wait forever.
        wait, asked = buffer._wait_for_next_poll, [time.monotonic()]

        def wait_while_workers_live(partition_id, last_debug_time):
            if time.monotonic() - asked[0] > WORKER_CHECK_S:
                workers = self.agent_loop_manager.agent_loop_workers
                calls = [worker.__ray_call__.remote(lambda _: None) for worker in workers]
                answered, _ = ray.wait(calls, num_returns=len(calls), timeout=WORKER_CHECK_S)
                ray.get(answered)  # a dead worker's call comes back at once, raising what names it; a busy one is asked again
                asked[0] = time.monotonic()
            return wait(partition_id, last_debug_time)

        buffer._wait_for_next_poll = wait_while_workers_live
        return buffer

    def _check_faults(self, batch: KVBatchMeta, partition_id: str) -> None:
        """Stop the run (``rollout/faults.py``) on a dead engine, or on more faults than the budget:
        in training per step, in validation over the pass so far (no further batch is started)."""
        tags = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["extra_fields"])["extra_fields"]
        if partition_id == "val":
            tally, where = self._val_faults
        else:
            tally, where = FaultTally(), f"training step {self.global_steps}"
        tally.add_tags(list(tags))
        tally.check(self.settings.trainer.fault_budget, where)

    # ------------------------------ building the policies ------------------------------

    def _init_resource_pool_mgr(self):
        super()._init_resource_pool_mgr()
        self._actor_role = next(role for role in ACTOR_ROLES if role in self.role_worker_mapping)
        # verl's hybrid worker with the shared-prefix forward (actor.use_prefix_grouper), for full-model groups
        self._full_model_worker = ray.remote(self.full_model_worker)
        first = self.adapter_worker if self.first_group == ADAPTER_GROUP else self.full_model_worker
        self.role_worker_mapping[self._actor_role] = ray.remote(first)
        if self.use_critic:
            if ADAPTER_GROUP in self.group_policies:  # the preflight says so first; here for a run without it
                raise ValueError("critic.enable: a critic with LoRA-adapter policies is not supported (docs/training.md)")
            self.role_worker_mapping[Role.Critic] = ray.remote(ValueModelWorker)
        spec = dict(self.resource_pool_manager.resource_pool_spec)
        trainer = self.config.trainer
        for name in self.group_policies:
            policy = self.policy_table.get(name)
            if policy is not None and policy.pool == "own":
                spec[f"policy_{name}"] = policy.own_pool(trainer.n_gpus_per_node, trainer.nnodes)
        shared = sum(name == ADAPTER_GROUP or self.policy_table[name].pool == "shared" for name in self.group_policies)
        colocate = max(3, shared + 1)  # one process per shared group on each GPU of the trainer's pool (+1 for a reward model)
        self._check_pools_fit(spec, colocate)
        self.resource_pool_manager = ResourcePoolManager(resource_pool_spec=spec, mapping=self.mapping, max_colocate_count=colocate)

    def _check_pools_fit(self, spec: dict[str, list[int]], colocate: int) -> None:
        """verl waits for a pool's placement groups without a bound: a pool no live node can hold
        is an error here, naming its key and what each node has. Each slot's bundle also asks for
        ``colocate`` CPUs (verl's max_colocate_count)."""
        resource = get_platform().ray_resource_name()
        nodes = {node["NodeID"]: min(node["Resources"].get(resource, 0), node["Resources"].get("CPU", 0) // colocate)
                 for node in ray.nodes() if node["Alive"]}
        problem = refusal(spec, nodes, resource, colocate)
        if problem is not None:
            raise ValueError(problem)

    def _setup(self):
        super()._setup()  # the first group, its replicas and sync, reward loop; checkpoint load deferred
        # verl's, in the first group's processes; a frozen policy's is left unused, as the other groups build none
        critic = self.critic_wg if self.use_critic and self.policy_table[self.first_group].trainable else None
        self.groups = {self.first_group: self._group(self.first_group, self.config, self.actor_rollout_wg, *self._first_rollout(), critic)}
        for name in list(self.group_policies)[1:]:
            self.groups[name] = self._build_group(name)
        self.checkpoint_manager = MultiCheckpointManager(list(self.groups.values()))
        if self._enable_hybrid_replicas:  # they give the trainer its memory back while it loads the checkpoint
            self.checkpoint_manager.sleep_replicas()
        placement = {name: nodes_of(group) for name, group in self.groups.items()}
        print(f"{PLACEMENT} {json.dumps(placement)}", flush=True)  # what runs on which Ray node (docs/cluster.md)
        self._actor_names = who(self.groups, placement)  # Ray actor id -> what and where, for a death's message
        self._episode_workers_named = False
        self._check_checkpoint_folder(placement)
        self._load_checkpoint()

    def _group(self, name: str, config, worker_group, servers, sync, critic=None, tokenizer=None) -> PolicyGroup:
        policies = self.group_policies[name]
        return PolicyGroup(
            name, any(self.policy_table[p].trainable for p in policies), config, worker_group, servers, sync,
            adapters=tuple(policies) if name == ADAPTER_GROUP else (), critic=critic, tokenizer=tokenizer,
        )

    def _build_group(self, name: str) -> PolicyGroup:
        """A worker group, rollout replicas and weight sync for the full-model policy ``name`` (as
        verl's _setup does for the actor), in its own processes: two groups never share a worker process."""
        config = copy.deepcopy(self.config)
        with open_dict(config):
            config.actor_rollout_ref = copy.deepcopy(self._configured_actor_rollout_ref)
            # the LR horizon verl's _init_dataloader wrote into the main config
            config.actor_rollout_ref.actor.optim.total_training_steps = self.config.actor_rollout_ref.actor.optim.total_training_steps
        config = policy_config(config, name)
        role = self._actor_role
        pool_name = "global_pool" if self.policy_table[name].pool == "shared" else f"policy_{name}"
        pool = self.resource_pool_manager.resource_pool_dict[pool_name]
        classes = {str(role): RayClassWithInitArgs(cls=self._full_model_worker, config=config.actor_rollout_ref, role=str(role))}
        with_critic = self.use_critic and self.policy_table[name].trainable  # a frozen policy's rows need no values
        if with_critic:
            classes[str(Role.Critic)], critic_config = self._critic_class(config)
        workers = RayWorkerGroup(
            resource_pool=pool, ray_cls_with_init=create_colocated_worker_cls(class_dict=classes), device_name=self.config.trainer.device,
        ).spawn(prefix_set=list(classes))
        group = workers[str(role)]
        group.init_model()
        critic = workers[str(Role.Critic)] if with_critic else None
        if critic is not None:
            critic.reset()  # builds the value model (verl's TrainingWorker), as verl's _setup does
            critic.set_loss_fn(partial(value_loss, config=critic_config))
        servers, sync = self._rollout(config, group, pool)
        model = config.actor_rollout_ref.model
        # another model family's tokenizer, as its workers load it; the trainer's own where the tokenizer is the first group's
        same = tokenizer_source(model) == tokenizer_source(self.config.actor_rollout_ref.model)
        tokenizer = None if same else omega_conf_to_dataclass(model).tokenizer
        return self._group(name, config, group, servers, sync, critic, tokenizer)

    def _first_rollout(self) -> tuple[LLMServerManager, CheckpointEngineManager]:
        """The first group's rollout replicas and weight sync: verl's own (its _setup built them)."""
        return self.llm_server_manager, self.checkpoint_manager

    def _rollout(self, config, worker_group, pool) -> tuple[LLMServerManager, CheckpointEngineManager]:
        """Another group's rollout replicas and weight sync, as verl's _setup builds the actor's: replicas
        in the group's trainer processes, synced in-process ("naive")."""
        servers = LLMServerManager.create(config=config, worker_group=worker_group, rollout_resource_pool=pool)
        sync_config = omega_conf_to_dataclass(config.actor_rollout_ref.rollout.checkpoint_engine)
        sync_config.backend = "naive"  # as verl's own sync trainer
        return servers, CheckpointEngineManager(config=sync_config, actor_wg=worker_group, replicas=servers.get_replicas())

    def _critic_class(self, config):
        """verl's value-model worker for one policy's config (as verl's _setup builds the critic):
        the class to colocate with the policy's actor, and the critic config its loss reads."""
        critic_config = omega_conf_to_dataclass(config.critic)
        critic_config.engine.infer_max_token_len_per_gpu = critic_config.ppo_infer_max_token_len_per_gpu
        critic_config.engine.max_token_len_per_gpu = critic_config.ppo_infer_max_token_len_per_gpu
        worker_config = TrainingWorkerConfig(
            model_type="value_model", model_config=critic_config.model, engine_config=critic_config.engine,
            optimizer_config=critic_config.optim, checkpoint_config=critic_config.checkpoint,
        )
        return RayClassWithInitArgs(cls=self.role_worker_mapping[Role.Critic], config=worker_config), critic_config

    def get_llm_client(self) -> PolicyRouterClient:
        clients = {name: group.servers.get_client(client_cls=self.llm_client_cls) for name, group in self.groups.items()}
        routes = {
            policy: (self.group_of[policy], policy if policy in self.groups[self.group_of[policy]].adapters else None)
            for policy in self.policy_table
        }
        return PolicyRouterClient(self.config, clients, routes)

    def _rollout_server_managers(self):
        return [group.servers for group in self.groups.values()]

    @contextlib.contextmanager
    def _serving(self, group: PolicyGroup):
        """verl's per-batch methods, pointed at one policy's worker group and config."""
        saved = self.actor_rollout_wg, getattr(self, "ref_policy_wg", None), getattr(self, "critic_wg", None), self.config, self.tokenizer
        self.actor_rollout_wg = group.worker_group
        if self.use_reference_policy:
            self.ref_policy_wg = group.worker_group  # ref lives in the actor's process (ActorRolloutRef)
        self.critic_wg = group.critic
        self.config = group.config
        self.tokenizer = group.tokenizer or self.tokenizer  # a batch padded with a token of its own policy
        try:
            yield
        finally:
            self.actor_rollout_wg, self.ref_policy_wg, self.critic_wg, self.config, self.tokenizer = saved

    # ------------------------------ one training step ------------------------------

    def step(self, metrics: dict, timing_raw: dict) -> KVBatchMeta:
        """verl's step; an actor of the run that died (a trainer rank or a server, killed, out of
        memory, or on a node that went away) stops the run with one message naming it."""
        try:
            if not self._episode_workers_named:  # verl hands the agent loop manager over in fit()
                manager = self.agent_loop_manager
                self._actor_names.update(name_actors(manager.agent_loop_workers, "episode worker {}", manager.worker_nodes))
                self._episode_workers_named = True
            return super().step(metrics, timing_raw)
        except ray.exceptions.RayActorError as error:
            what = self._actor_names.get(error.actor_id or "") or named_by_ray(error.actor_id)
            said = str(error).strip().splitlines() or [type(error).__name__]  # Ray's: what happened, the actor's details, why it died
            cause = " ".join([said[0], *(line for line in said[1:] if "dead because" in line)])
            raise RunStopped(
                f"{STOPPED} training step {self.global_steps}: {what} died: {cause}\n"
                "The last checkpoint is intact: the same command with trainer.resume_mode=auto continues from it."
            ) from None
        except RunStopped as stop:  # a dead server met by episodes (rollout/faults.py): say which one, where
            first, _, rest = str(stop).partition("\n")
            dead = [name for actor_id, name in self._actor_names.items() if actor_id in rest]  # the servers it met
            if not dead:
                raise
            raise RunStopped(f"{first} (dead: {'; '.join(dead)})\n{rest}") from None

    def _step_once(self, metrics: dict, timing_raw: dict, sample_batch_size: int) -> KVBatchMeta:
        with marked_timer("gen", timing_raw, color="red"):
            self.on_sample_begin()
            batch, off_policy_metrics = self.replay_buffer.sample(
                global_steps=self.global_steps, partition_id="train", batch_size=sample_batch_size
            )
            metrics.update(off_policy_metrics)
            self.on_sample_end()
        if self.reward_loop_manager.reward_loop_worker_handles is None:
            raise ValueError("a colocated reward model would overwrite the per-sample rewards; disable reward.reward_model")

        parts, tags = self._partition(batch)
        trainable = {name for name in parts if self.policy_table[name].trainable}  # a frozen policy's staleness is not reported
        per_policy: dict[str, dict] = {
            name: {"rows": float(len(part)), **(staleness([tags[key] for key in part.keys], self.global_steps) if name in trainable else {})}
            for name, part in parts.items()
        }
        with marked_timer("old_log_prob", timing_raw, color="blue"):
            for name, part in parts.items():
                with self._serving(self._group_of(name)):
                    self._put_row_temperatures(part, tags)
                    part.extra_info["temperature"] = self.config.actor_rollout_ref.rollout.temperature
                    part = self._balance_batch(part, metrics=per_policy[name])  # pads with this policy's rows only
                    self._name_adapter(part, name)
                    parts[name] = self._compute_old_log_prob(part, metrics=per_policy[name])
                    if self.use_reference_policy:
                        parts[name] = self._compute_ref_log_prob(parts[name], metrics=per_policy[name])
                    if self.use_critic:  # each policy's rows valued by its own critic (timed apart, as verl's "values")
                        with marked_timer("values", timing_raw, color="cyan"):
                            parts[name] = self._compute_values(parts[name], metrics=per_policy[name])
                    parts[name].extra_info = {}  # per-policy settings (temperature, ...) must not clash in concat
        batch = KVBatchMeta.concat(list(parts.values()))

        with marked_timer("adv", timing_raw, color="brown"):
            batch = self._compute_advantage(batch, metrics=metrics, parts=parts)
        # the workers fetch the fields a batch lists: take the parts again, now with the advantages
        parts = {name: batch.select_keys(part.keys) for name, part in parts.items()}
        idle = set()  # policies whose own staleness bound left none of this step's replies to learn from: no update (no decay, no step)
        for name, part in parts.items():
            if name in trainable and self.policy_table[name].max_staleness is not None:
                untrained, replies = self._leave_untrained(part, tags, self.policy_table[name].max_staleness)
                per_policy[name]["off_policy/untrained_rows"] = float(untrained)
                if untrained and untrained == replies:
                    idle.add(name)

        if self.use_critic:
            with marked_timer("update_critic", timing_raw, color="pink"):
                for name, part in parts.items():
                    group = self._group_of(name)
                    if group.critic is None:
                        continue
                    real = [key for key, tag in zip(part.keys, part.tags) if not tag.get("is_padding", False)]
                    rows = tq.kv_batch_get(keys=real, partition_id=part.partition_id, select_fields=["values", "returns", "response_mask"])
                    # before its update: how well the values the advantages used explained the returns
                    per_policy[name]["critic/vf_explained_var"] = explained_variance(
                        *(list(rows[field].unbind(0)) for field in ("values", "returns", "response_mask"))
                    )
                    if self.policy_table[name].trainable and name not in idle:
                        with self._serving(group):
                            self._update_critic(part, metrics=per_policy[name])
        if self.config.trainer.critic_warmup <= self.global_steps:
            with marked_timer("update_actor", timing_raw, color="red"):
                for name, part in parts.items():
                    if self.policy_table[name].trainable and name not in idle:
                        with self._serving(self._group_of(name)):
                            self._name_adapter(part, name)
                            self._update_actor(part, metrics=per_policy[name])
        metrics.update(policy_metrics(per_policy, trainable))
        return batch

    def _leave_untrained(self, part: KVBatchMeta, tags: dict[str, dict], bound: int) -> tuple[int, int]:
        """A policy's own staleness bound (``max_staleness``): its rows whose role's replies in the
        episode include one sampled more than ``bound`` pushes behind keep their place in their
        groups (their advantages are the group's) but are not trained: their response and loss masks
        are zeroed, as verl's padding rows' are (the loss is a mean over the loss mask's tokens).
        Returns (rows left untrained, rows with a reply). ``tags``: row key -> its tags
        (``_partition``'s; padding rows have none)."""
        behind = {key: lag(tags[key], self.global_steps) for key in part.keys if key in tags and not tags[key].get("mas_placeholder")}
        replies = [key for key, value in behind.items() if value is not None]
        stale = [key for key in replies if behind[key] > bound]
        if stale:
            masks = tq.kv_batch_get(keys=stale, partition_id=part.partition_id, select_fields=["response_mask"])["response_mask"]
            zeros = [{"response_mask": torch.zeros_like(mask), "loss_mask": torch.zeros_like(mask)} for mask in masks.unbind(0)]
            tq.kv_batch_put(keys=stale, partition_id=part.partition_id, fields=list_of_dict_to_tensordict(zeros))
        return len(stale), len(replies)

    def _put_row_temperatures(self, part: KVBatchMeta, tags: dict[str, dict]) -> None:
        """Each row's sampling temperature (its ``ROW_TEMPERATURE`` tag) as a field of the batch: the
        engine computes old log-probs, the reference and the update of a row at it, so a role
        sampled at its own temperature stays on-policy (verl's scalar is the policy group's
        ``rollout.temperature``). Before padding: verl's padding rows copy the first row's fields.
        ``tags``: row key -> its tags (``_partition``'s)."""
        default = float(self.config.actor_rollout_ref.rollout.temperature)
        values = torch.tensor([float(tags[key].get(ROW_TEMPERATURE, default)) for key in part.keys], dtype=torch.float32)
        tq.kv_batch_put(keys=part.keys, partition_id=part.partition_id, fields=TensorDict({ROW_TEMPERATURE: values}, batch_size=len(values)))

    def _group_of(self, policy: str) -> PolicyGroup:
        return self.groups[self.group_of[policy]]

    def _name_adapter(self, part: KVBatchMeta, policy: str) -> None:
        """A batch of the adapter group names the adapter its rows belong to (its policy's)."""
        if policy in self._group_of(policy).adapters:
            part.extra_info[ADAPTER_KEY] = policy

    def _partition(self, batch: KVBatchMeta) -> tuple[dict[str, KVBatchMeta], dict[str, dict]]:
        """The batch's rows by policy (``mas_policy`` tag), each checked to come from its policy's
        current weights: a trainable policy's replies must come from the weights after the last update.
        Also each row's tags by its key (read once here, for the step's other per-row needs)."""
        tags = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["extra_fields"])["extra_fields"]
        keys: dict[str, list[str]] = {name: [] for name in self.policy_table}
        for key, tag in zip(batch.keys, tags):
            if "mas_policy" not in tag:
                raise ValueError(f"row {key}: mas_sync trains the rows of the pettingllms_episode agent loop (dataset column agent_name)")
            policy = tag["mas_policy"]
            if tag.get("mas_placeholder"):  # no reply behind it: nothing to check, nothing to train
                keys[policy].append(key)
                continue
            if tag["mas_served_by"] != [policy]:
                raise AssertionError(f"row {key}: role {tag['mas_role']} of policy {policy!r} was served by {tag['mas_served_by']}")
            if self.policy_table[policy].trainable:
                self._check_versions(key, policy, tag["mas_weight_versions"])
            keys[policy].append(key)
        return {name: batch.select_keys(rows) for name, rows in keys.items() if rows}, dict(zip(batch.keys, tags))

    def _check_versions(self, key: str, policy: str, versions: list[int]) -> None:
        """A trainable policy's replies come from its weights after the last update (sync), or, in an
        asynchronous mode, from no later weights and within verl's staleness bound: a prompt group is
        sampled at most ``max_off_policy_threshold`` steps after it was submitted, when the weights
        were at most one step old (``drop``: verl evicts older ones)."""
        newest = self.global_steps - 1
        if self.trainer_mode == "sync":
            if versions != [newest]:
                raise AssertionError(f"row {key}: policy {policy!r} sampled with weights of steps {versions}, "
                                     f"expected {newest} (off-policy rollout)")
            return
        bound = self.replay_buffer.max_off_policy_threshold
        if self.replay_buffer.max_off_policy_strategy != "drop":
            bound = None  # "wait" trains every group however old (verl's dropless mode): logged, not bounded
        if not versions or max(versions) > newest or (bound is not None and newest - min(versions) > bound - 1):
            raise AssertionError(f"row {key}: policy {policy!r} sampled with weights of steps {versions} at step "
                                 f"{self.global_steps} (newest {newest}, trainer.v1.sampler.max_off_policy_threshold={bound})")

    def _compute_values(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        if self.critic_wg is not None:
            return super()._compute_values(batch, metrics)
        # a frozen policy has no critic: its rows, never trained, enter GAE's pass over the batch valued 0
        masks = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["response_mask"])["response_mask"]
        zeros = [{"values": torch.zeros(len(mask))} for mask in masks.unbind(0)]
        tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=list_of_dict_to_tensordict(zeros))
        return batch

    def _compute_metrics(self, batch, metrics, timing_raw, global_steps, epoch):
        """verl's step metrics read each row's weight versions as integers; an episode that failed
        before its first reply sampled from no weights (``None``): its placeholder row counts as
        fresh, sampled from the weights this step trains (version ``global_steps - 1``, staleness 0)."""
        for tag in batch.tags:
            for name in ("min_global_steps", "max_global_steps"):
                if tag.get(name) is None:
                    tag[name] = global_steps - 1
        return super()._compute_metrics(batch, metrics, timing_raw, global_steps, epoch)

    def _compute_advantage(self, batch, metrics: dict, parts: dict[str, KVBatchMeta] | None = None):
        """verl's advantage pass over the step's rows (``parts``: the batch by policy), after the
        rows' own rewards and groups are set and the ``mas/`` metrics taken. GAE runs per policy:
        verl whitens its advantages over the rows it is given, and each policy's rows are valued by
        its own critic (a frozen policy's, by none)."""
        real = [key for key, tag in zip(batch.keys, batch.tags) if not tag.get("is_padding", False)]
        rows = tq.kv_batch_get(keys=real, partition_id=batch.partition_id, select_fields=["uid", "rm_scores", "extra_fields"])
        tags = [dict(t) for t in rows["extra_fields"]]
        own = self.config.algorithm.adv_estimator in (AT_GRPO, AdvantageEstimator.GAE)  # per-turn rewards; gae: each row its own trajectory
        regrouped = own or any(tag.get("mas_placeholder") for tag in tags)
        if own:
            if self.settings.trainer.null_reward == NULL_REWARD_PERMUTE:
                metrics.update(self._null_rewards(real, tags))
            self._own_rewards_and_groups(batch, real, rows["rm_scores"], tags)
        elif regrouped:
            self._placeholders_apart(batch, real, tags)
        if regrouped:  # the rows as the estimator will read them
            rows = tq.kv_batch_get(keys=real, partition_id=batch.partition_id, select_fields=["uid", "rm_scores"])
        index = np.array(list(rows["uid"]), dtype=object)
        scores = torch.stack([s.sum() for s in rows["rm_scores"].unbind(0)])
        check_groups_within_policies(index, [t["mas_policy"] for t in tags])
        metrics.update(episode_metrics(tags))
        by_policy: dict[str, list[float]] = defaultdict(list)
        for tag, score in zip(tags, scores.tolist()):
            by_policy[tag["mas_policy"]].append(score)
        metrics.update({f"policy/{name}/reward_mean": float(np.mean(values)) for name, values in by_policy.items()})
        if self.config.algorithm.adv_estimator == AT_GRPO:
            metrics.update(group_stats(index))
            metrics["at_grpo/zero_variance_frac"] = zero_variance_frac(scores, index)
        if self.config.algorithm.adv_estimator == AdvantageEstimator.GAE and parts:
            found = {name: {} for name in parts}  # verl's metrics of each pass (rollout correction, ...): per policy, and their mean
            batch = KVBatchMeta.concat([super(MASTrainer, self)._compute_advantage(part, found[name]) for name, part in parts.items()])
            for key in set().union(*found.values()):
                values = [per[key] for per in found.values() if key in per]
                metrics.update({f"policy/{name}/{key}": per[key] for name, per in found.items() if key in per})
                metrics[key] = float(np.mean(values))
            batch.extra_info = batch.extra_info or {}  # as verl's pass returns it (concat leaves none)
        else:
            batch = super()._compute_advantage(batch, metrics)
        if self.settings.paths.batch_dump_dir:
            self._dump_batch(self.settings.paths.batch_dump_dir, batch, real, index, scores, tags)
        return batch

    def _null_rewards(self, keys: list[str], tags: list[dict]) -> dict[str, float]:
        """The null-training control: each row's reward shuffled within its AT-GRPO group, seeded by
        the run's data seed and the step, over the rows in an order of their own (group, node, branch,
        turn, role, row key: not the order episodes finished in), so a resumed run shuffles as it would
        have; a failed episode's placeholder row keeps its own. Each row's earned reward stays in
        ``mas_earned_reward`` (the batch dump shows both). Returns the share of rows whose reward moved."""
        order = lambda i: tuple(str(tags[i].get(f"mas_{part}")) for part in ("group", "node", "branch", "turn", "role")) + (keys[i],)  # noqa: E731
        rows = sorted((i for i, tag in enumerate(tags) if not tag.get("mas_placeholder")), key=order)
        rewards = [tags[i]["mas_reward"] for i in rows]
        rng = np.random.default_rng([int(self.config.data.get("seed") or 0), int(self.global_steps)])
        shuffled = permute_within_groups(rewards, [tags[i]["mas_group"] for i in rows], rng)
        for i, reward in zip(rows, shuffled.tolist()):
            tags[i]["mas_earned_reward"], tags[i]["mas_reward"] = tags[i]["mas_reward"], reward
        return {"mas/null_reward/moved_frac": float(np.mean(np.asarray(rewards) != shuffled)) if rows else 0.0}

    @staticmethod
    def _own_rewards_and_groups(batch, keys: list[str], rm_scores, tags: list[dict]) -> None:
        """AT-GRPO and GAE rows: each keeps its own reward (verl's agent-loop worker copied the
        episode's last one onto every row) and is grouped by its (problem, turn, role, node) key,
        not by the problem's uid (GAE reads no groups)."""
        fields = []
        for scores, tag in zip(rm_scores.unbind(0), tags):
            own = torch.zeros_like(scores)
            own[-1] = tag["mas_reward"]  # verl's layout: the reward sits on the response's last token
            fields.append({"rm_scores": own, "uid": tag["mas_group"]})
        tq.kv_batch_put(keys=keys, partition_id=batch.partition_id, fields=list_of_dict_to_tensordict(fields))

    @staticmethod
    def _placeholders_apart(batch, keys: list[str], tags: list[dict]) -> None:
        """Trajectory estimators (grpo, rloo, ...) group rows by the problem's uid: a failed episode's
        placeholder row (reward 0, never trained) would enter its problem's baseline. It gets its own
        group, its AT-GRPO one (``agent_loop.group_key``)."""
        apart = [(key, tag) for key, tag in zip(keys, tags) if tag.get("mas_placeholder")]
        tq.kv_batch_put(keys=[key for key, _ in apart], partition_id=batch.partition_id,
                        fields=list_of_dict_to_tensordict([{"uid": tag["mas_group"]} for _, tag in apart]))

    def _dump_batch(self, dump_dir: str, batch, keys: list[str], index, scores: torch.Tensor, tags: list[dict]) -> None:
        """One JSON line per training row of this step, as the advantage step saw it (a step of several
        updates, verl's ``parameter_sync_step``, adds each update's rows to the step's file)."""
        advantages = tq.kv_batch_get(keys=keys, partition_id=batch.partition_id, select_fields=["advantages"])["advantages"]
        os.makedirs(dump_dir, exist_ok=True)
        with open(os.path.join(dump_dir, f"step_{self.global_steps}.jsonl"), "a" if self.local_trigger_step else "w") as f:
            for key, group, score, advantage, tag in zip(keys, index, scores.tolist(), advantages.unbind(0), tags):
                row = {"key": key, "group": group, "score": score, "advantage": float(advantage[0]) if advantage.numel() else 0.0}
                row.update({name: value for name, value in tag.items() if name.startswith("mas_")})
                f.write(json.dumps(row) + "\n")

    # ------------------------------ validation ------------------------------

    def _validate(self) -> dict[str, float]:
        """verl's validation; under ``swap_policies`` a second pass serves each of the two
        policies' roles with the other, reported under ``swap/``. In training, the metrics are
        also written beside the step's checkpoint (``VAL_METRICS``: checkpoints are chosen on them)."""
        # each pass tallied on its own (_check_faults)
        self._val_faults = FaultTally(), f"validation at step {self.global_steps}"
        metrics = super()._validate()
        if self.settings.swap_policies:
            plain = self.val_dataloader
            self.val_dataloader = _with_column(plain, SWAPPED_KWARG, True)
            self._val_faults = FaultTally(), f"swapped validation at step {self.global_steps}"
            try:
                metrics.update({f"swap/{key}": value for key, value in super()._validate().items()})
            finally:
                self.val_dataloader = plain
        step_dir = step_folder(self.config.trainer.default_local_dir, self.global_steps)
        if not self.config.trainer.get("val_only", False) and os.path.isdir(step_dir):
            path = os.path.join(step_dir, VAL_METRICS)
            files = self.config.data.val_files
            record = {"global_step": self.global_steps, "val_files": [files] if isinstance(files, str) else list(files), "metrics": metrics}
            write_whole(path, json.dumps(record, indent=1, default=float))  # default: numpy scalars
        return metrics

    # ------------------------------ checkpoints ------------------------------
