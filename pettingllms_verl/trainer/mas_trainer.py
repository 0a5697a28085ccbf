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
import math
import os
import re
import shutil
import time
from collections import Counter, defaultdict
from functools import partial

import numpy as np
import ray
import torch
import transfer_queue as tq
from omegaconf import open_dict
from tensordict import TensorDict
from transfer_queue import KVBatchMeta
from verl.checkpoint_engine import CheckpointEngineManager
from verl.single_controller.ray import RayClassWithInitArgs, RayWorkerGroup, ResourcePoolManager, create_colocated_worker_cls
from verl.plugin.platform import get_platform
from verl.trainer.ppo.core_algos import AdvantageEstimator
from verl.trainer.ppo.padding_utils import upsample_batch_to_divisible_size
from verl.trainer.ppo.utils import Role
from verl.trainer.ppo.v1.trainer_base import _count_tq_prompt_groups, register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path
from verl.utils.config import omega_conf_to_dataclass
from verl.utils.debug import marked_timer
from verl.utils.seqlen_balancing import calculate_workload, log_seqlen_unbalance
from verl.utils.tensordict_utils import list_of_dict_to_tensordict
from verl.workers.engine_workers import TrainingWorkerConfig
from verl.workers.rollout.llm_server import LLMServerManager
from verl.workers.utils.losses import value_loss

from pettingllms_verl.algo import AT_GRPO, group_stats, permute_within_groups, zero_variance_frac
from pettingllms_verl.config import (ADAPTER_GROUP, CRITICS_DIR, NULL_REWARD_PERMUTE, POLICIES_DIR, ROW_TEMPERATURE, SECTION, TRAINER_MODES,
                                     VAL_METRICS, load, policy_config)
from pettingllms_verl.files import write_whole
from pettingllms_verl.episodes.tags import ERRORS, SWAPPED_KWARG, TRUNCATIONS
from pettingllms_verl.rollout.faults import STOPPED, FaultTally, RunStopped
from pettingllms_verl.trainer.critic import ValueModelWorker
from pettingllms_verl.trainer.multi_lora import ADAPTER_KEY, MultiLoRAActorRolloutRefWorker
from pettingllms_verl.trainer import rendezvous
from pettingllms_verl.placement import PLACEMENT, actors_of, blind_nodes, name_actors, named_by_ray, nodes_of, refusal, who
from pettingllms_verl.trainer.policies import MultiCheckpointManager, PolicyGroup, PolicyRouterClient
from pettingllms_verl.trainer.shared_prefix import SharedPrefixActorRolloutRefWorker, ranks_of_groups

PARTIAL_SUFFIX = ".partial"  # a step folder being written; renamed to global_step_N when complete
QUEUE_DIR = "transfer_queue"  # global_step_N/transfer_queue/: an asynchronous run's episodes under way (verl's layout)

TRAINER_MODE = "mas_sync"
ACTOR_ROLES = (Role.ActorRollout, Role.ActorRolloutRef)
WORKER_CHECK_S = 10.0  # while waiting for episodes: how often the agent-loop workers are asked whether they live


def episode_metrics(tags: list[dict]) -> dict[str, float]:
    """``mas/`` metrics from the rows' ``extra_fields`` (see ``rollout/agent_loop.py``). An episode
    ended by a fault counts as a failure in ``mas/success`` and in ``mas/episode_errors`` or
    ``mas/truncated`` (and per cause); ``mas/fault_share`` (and per cause) is the share of the
    step's episodes a fault ended, what the fault budget is held against."""
    metrics: dict[str, float] = {}
    ends = [t for t in tags if t.get("mas_episode_end")]
    if ends:
        metrics["mas/success"] = float(np.mean([bool(t["mas_success"]) for t in ends]))
        metrics["mas/turns_mean"] = float(np.mean([t["mas_turns"] for t in ends]))
        env_s, generate_s = sum(t["mas_env_s"] for t in ends), sum(t["mas_generate_s"] for t in ends)
        metrics["mas/env_time_frac"] = env_s / max(env_s + generate_s, 1e-9)
        # tree nodes sampled again because a weight push split their branches (asynchronous modes)
        metrics["mas/resampled_nodes"] = float(sum(t.get("mas_resampled_nodes") or 0 for t in ends))
        # episodes played on across a weight push (asynchronous modes): their later replies from newer weights
        metrics["mas/straddled_episodes"] = float(sum(bool(t.get("mas_straddled")) for t in ends))
        causes = [t.get("mas_end_cause") for t in ends]
        for total, kinds in (("mas/episode_errors", ERRORS), ("mas/truncated", TRUNCATIONS)):
            metrics[total] = float(sum(cause in kinds for cause in causes))
            metrics.update({f"{total}/{kind}": float(causes.count(kind)) for kind in kinds})
        tally = FaultTally()
        tally.add_tags(ends)
        metrics.update(tally.metrics())
        programs = [t["mas_program"] for t in ends if t.get("mas_program")]
        if programs:  # team programs (programs/episode.py): runs per episode, replays that asked something else
            metrics["mas/program/runs_mean"] = float(np.mean([p["runs"] for p in programs]))
            metrics["mas/program/calls"] = float(sum(p["calls"] for p in programs))  # through the gateway, replayed ones included
            metrics["mas/program/replayed_calls"] = float(sum(p["replayed_calls"] for p in programs))
            metrics["mas/program/replay_diverged"] = float(sum(p["diverged"] for p in programs))
    replies = [t for t in tags if not t.get("mas_placeholder")]
    metrics["mas/placeholder_rows"] = float(len(tags) - len(replies))  # episodes that failed before a reply: a row each, its own group
    metrics["mas/parse_failure_rate"] = float(np.mean([not t["mas_parse_ok"] for t in replies])) if replies else 0.0
    by_role: dict[str, list[float]] = defaultdict(list)
    sandbox: dict[str, Counter] = defaultdict(Counter)
    for t in replies:
        by_role[t["mas_role"]].append(t["mas_local_reward"])
        sandbox[t["mas_role"]].update(t.get("mas_sandbox_runs") or {})
    for role, counts in sorted(sandbox.items()):  # the sandbox runs of a role's programs this step, by status
        if not counts:
            continue
        metrics[f"mas/{role}/sandbox/runs"] = float(counts.total())
        metrics.update({f"mas/{role}/sandbox/{status}": float(runs) for status, runs in counts.items()})
    for role, rewards in sorted(by_role.items()):
        metrics[f"mas/{role}/reward_mean"] = float(np.mean(rewards))
    return metrics


def _with_column(batches, name: str, value):
    """The batches of a dataloader, each with one more per-row column (the agent loop's kwargs)."""
    for batch in batches:
        batch[name] = np.full(len(batch["raw_prompt"]), value, dtype=object)
        yield batch


def explained_variance(values: list[torch.Tensor], returns: list[torch.Tensor], masks: list[torch.Tensor]) -> float:
    """verl's ``critic/vf_explained_var`` over some rows: 1 - Var(returns - values) / Var(returns)
    over their response tokens.

    Args:
        values, returns, masks: per row, (response_len,) each.
    """
    keep = torch.cat([mask.bool() for mask in masks])
    value, ret = torch.cat(values)[keep].float(), torch.cat(returns)[keep].float()
    if ret.numel() < 2:
        return float("nan")
    return float(1.0 - torch.var(ret - value) / (torch.var(ret) + 1e-5))


def check_groups_within_policies(index, policies: list[str]) -> None:
    """An advantage group mixes rows of two policies only through a bug (AT-GRPO keys hold the role)."""
    seen: dict[str, str] = {}
    for group, policy in zip(index, policies):
        if seen.setdefault(group, policy) != policy:
            raise AssertionError(f"advantage group {group!r} spans policies {seen[group]!r} and {policy!r}")


def spread_padding(is_padding: list[bool], ranks: int, mini_batches: int) -> tuple[list[int], float]:
    """A row order that spreads padding rows evenly over the optimizer steps of an update.

    verl hands data-parallel rank r the r-th contiguous chunk of the batch and cuts each chunk into
    ``mini_batches`` consecutive mini-batches (one optimizer step each, over every rank's j-th
    piece). Its padding rows sit at the end, so the last step could hold one real row. Here each
    chunk keeps its real rows in order and deals its padding rows round-robin over its
    mini-batches (rows stay on their rank: the balancing over ranks is kept).

    Args:
        is_padding: (bs,) whether each row is padding, in the batch's order; bs divisible by
            ``ranks * mini_batches``.

    Returns:
        the new order (indices into the batch, (bs,)) and the smallest real-row share of any
        optimizer step (over all ranks' pieces of it) in that order.
    """
    size = len(is_padding)
    if size % (ranks * mini_batches):
        raise ValueError(f"{size} rows do not split into {ranks} ranks x {mini_batches} mini-batches")
    chunk, piece = size // ranks, size // ranks // mini_batches
    order, real_per_step = [], [0] * mini_batches
    for start in range(0, size, chunk):
        rows = range(start, start + chunk)
        real = [i for i in rows if not is_padding[i]]
        pads = [i for i in rows if is_padding[i]]
        # pads per mini-batch as even as they go; real rows fill the rest, in order
        quota = [len(pads) // mini_batches + (j < len(pads) % mini_batches) for j in range(mini_batches)]
        for j in range(mini_batches):
            take = piece - quota[j]
            order += real[:take] + pads[: quota[j]]
            real, pads = real[take:], pads[quota[j]:]
            real_per_step[j] += take
    return order, min(real_per_step) / (piece * ranks)


@register_trainer(TRAINER_MODE)
class MASTrainer(PPOTrainerSync):
    mode = TRAINER_MODE  # its trainer.v1.trainer_mode
    llm_client_cls = None  # verl's client class of the mode's schedule (None: verl's plain one)

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
        with open_dict(config):
            config.actor_rollout_ref = policy_config(config, self.first_group).actor_rollout_ref
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
        self._full_model_worker = ray.remote(SharedPrefixActorRolloutRefWorker)
        first = MultiLoRAActorRolloutRefWorker if self.first_group == ADAPTER_GROUP else SharedPrefixActorRolloutRefWorker
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
        self.groups = {self.first_group: self._group(self.first_group, self.config, self.actor_rollout_wg, self.llm_server_manager,
                                                     self.checkpoint_manager, critic)}
        for name in list(self.group_policies)[1:]:
            self.groups[name] = self._build_group(name)
        self.checkpoint_manager = MultiCheckpointManager(list(self.groups.values()))
        self.checkpoint_manager.sleep_replicas()
        placement = {name: nodes_of(group) for name, group in self.groups.items()}
        print(f"{PLACEMENT} {json.dumps(placement)}", flush=True)  # what runs on which Ray node (docs/cluster.md)
        self._actor_names = who(self.groups, placement)  # Ray actor id -> what and where, for a death's message
        self._episode_workers_named = False
        self._check_checkpoint_folder(placement)
        self._load_checkpoint()

    def _check_checkpoint_folder(self, placement: dict[str, dict[str, list[str]]]) -> None:
        """Every trainer rank writes its shards into trainer.default_local_dir and reads them back
        on resume, beside this process's files: a node that does not see the folder as this
        process does would save a checkpoint no resume can find whole. Refused before step 1."""
        trainer = self.config.trainer
        if trainer.val_only or (trainer.save_freq <= 0 and trainer.resume_mode == "disable"):
            return  # nothing is saved to it nor resumed from it
        folder = str(trainer.default_local_dir)
        for name, group in self.groups.items():
            try:
                blind = blind_nodes(folder, actors_of(group)["trainer"], placement[name]["trainer"])
            except OSError as error:
                raise ValueError(f"trainer.default_local_dir: checkpoints cannot be written to {folder}: {error}") from None
            if blind:
                raise ValueError(
                    f"trainer.default_local_dir: {folder} is not the same folder on node(s) {', '.join(blind)} "
                    f"(trainer ranks of {name}) as on this node ({ray.get_runtime_context().get_node_id()}): "
                    "a file written here is not there. Every node must see one folder for checkpoints to resume: "
                    "an absolute path on storage every node mounts (docs/cluster.md)."
                )

    def _group(self, name: str, config, worker_group, servers, sync, critic=None) -> PolicyGroup:
        policies = self.group_policies[name]
        return PolicyGroup(
            name, any(self.policy_table[p].trainable for p in policies), config, worker_group, servers, sync,
            adapters=tuple(policies) if name == ADAPTER_GROUP else (), critic=critic,
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
        servers = LLMServerManager.create(config=config, worker_group=group, rollout_resource_pool=pool)
        sync_config = omega_conf_to_dataclass(config.actor_rollout_ref.rollout.checkpoint_engine)
        sync_config.backend = "naive"  # as verl's own sync trainer
        sync = CheckpointEngineManager(config=sync_config, actor_wg=group, replicas=servers.get_replicas())
        return self._group(name, config, group, servers, sync, critic)

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
        saved = self.actor_rollout_wg, getattr(self, "ref_policy_wg", None), getattr(self, "critic_wg", None), self.config
        self.actor_rollout_wg = group.worker_group
        if self.use_reference_policy:
            self.ref_policy_wg = group.worker_group  # ref lives in the actor's process (ActorRolloutRef)
        self.critic_wg = group.critic
        self.config = group.config
        try:
            yield
        finally:
            self.actor_rollout_wg, self.ref_policy_wg, self.critic_wg, self.config = saved

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

        parts = self._partition(batch)
        per_policy: dict[str, dict] = {name: {"rows": float(len(part)), **self._staleness(part, name)} for name, part in parts.items()}
        with marked_timer("old_log_prob", timing_raw, color="blue"):
            for name, part in parts.items():
                with self._serving(self._group_of(name)):
                    self._put_row_temperatures(part)
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
                    if self.policy_table[name].trainable:
                        with self._serving(group):
                            self._update_critic(part, metrics=per_policy[name])
        if self.config.trainer.critic_warmup <= self.global_steps:
            with marked_timer("update_actor", timing_raw, color="red"):
                for name, part in parts.items():
                    if self.policy_table[name].trainable:
                        with self._serving(self._group_of(name)):
                            self._name_adapter(part, name)
                            self._update_actor(part, metrics=per_policy[name])
        self._merge_policy_metrics(metrics, per_policy)
        return batch

    def _staleness(self, part: KVBatchMeta, policy: str) -> dict[str, float]:
        """How many weight pushes behind this policy's newest its rows' replies were sampled (0: the
        weights this step trains; > 0 only in an asynchronous mode); a frozen policy's are not reported."""
        if not self.policy_table[policy].trainable:
            return {}
        tags = tq.kv_batch_get(keys=part.keys, partition_id=part.partition_id, select_fields=["extra_fields"])["extra_fields"]
        lags = [self.global_steps - 1 - min(tag["mas_weight_versions"]) for tag in tags if tag.get("mas_weight_versions")]
        if not lags:
            return {}
        return {"off_policy/staleness_mean": float(np.mean(lags)), "off_policy/staleness_max": float(max(lags))}

    def _put_row_temperatures(self, part: KVBatchMeta) -> None:
        """Each row's sampling temperature (its ``ROW_TEMPERATURE`` tag) as a field of the batch: the
        engine computes old log-probs, the reference and the update of a row at it, so a role
        sampled at its own temperature stays on-policy (verl's scalar is the policy group's
        ``rollout.temperature``). Before padding: verl's padding rows copy the first row's fields."""
        tags = tq.kv_batch_get(keys=part.keys, partition_id=part.partition_id, select_fields=["extra_fields"])["extra_fields"]
        default = float(self.config.actor_rollout_ref.rollout.temperature)
        values = torch.tensor([float(tag.get(ROW_TEMPERATURE, default)) for tag in tags], dtype=torch.float32)
        tq.kv_batch_put(keys=part.keys, partition_id=part.partition_id, fields=TensorDict({ROW_TEMPERATURE: values}, batch_size=len(values)))

    def _balance_batch(self, batch: KVBatchMeta, metrics, logging_prefix="global_seqlen", keep_minibatch=False):
        """verl's padding and balancing over data-parallel ranks; with the shared-prefix forward on,
        balanced by whole AT-GRPO groups instead of rows (``shared_prefix.ranks_of_groups``), so the
        K branches of one prompt land on one rank, adjacent, and share their prompt's forward there."""
        if not self.config.actor_rollout_ref.actor.get("use_prefix_grouper", False):
            return super()._balance_batch(batch, metrics, logging_prefix, keep_minibatch)
        dp_size = self._dp_size()
        batch = upsample_batch_to_divisible_size(batch, self._get_required_batch_multiple(dp_size), self.tokenizer.eos_token_id)
        seq_lens = [int(tag["seq_len"]) for tag in batch.tags]
        tags = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["extra_fields"])["extra_fields"]
        groups: dict[str, list[int]] = {}
        for i, (tag, meta) in enumerate(zip(tags, batch.tags)):  # verl's padding rows copy row 0's tags: each stands alone
            real = isinstance(tag, dict) and "mas_group" in tag and not meta.get("is_padding")
            groups.setdefault(tag["mas_group"] if real else f"row{i}", []).append(i)
        workloads = calculate_workload(torch.tensor(seq_lens, dtype=torch.int64)).tolist()
        partitions = ranks_of_groups(list(groups.values()), workloads, dp_size)
        batch.reorder([i for rows in partitions for i in rows])
        metrics.update(log_seqlen_unbalance(seqlen_list=seq_lens, partitions=partitions, prefix=logging_prefix))
        return batch

    def _dp_size(self) -> int:
        """The actor's data-parallel size (verl's dispatch info, queried once as verl does)."""
        wg = self.actor_rollout_wg
        if "actor" not in wg._dispatch_info:
            wg._dispatch_info["actor"] = wg._query_dispatch_info("actor")
        return max(wg._dispatch_info["actor"]) + 1

    def _group_of(self, policy: str) -> PolicyGroup:
        return self.groups[self.group_of[policy]]

    def _name_adapter(self, part: KVBatchMeta, policy: str) -> None:
        """A batch of the adapter group names the adapter its rows belong to (its policy's)."""
        if policy in self._group_of(policy).adapters:
            part.extra_info[ADAPTER_KEY] = policy

    def _partition(self, batch: KVBatchMeta) -> dict[str, KVBatchMeta]:
        """The batch's rows by policy (``mas_policy`` tag), each checked to come from its policy's
        current weights: a trainable policy's replies must come from the weights after the last update."""
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
        return {name: batch.select_keys(rows) for name, rows in keys.items() if rows}

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

    def _merge_policy_metrics(self, metrics: dict, per_policy: dict[str, dict]) -> None:
        """``policy/<name>/...`` for every policy; verl's plain names (``actor/grad_norm``, ...) are
        the mean over the trainable policies (over all when every policy is frozen)."""
        trainable = [name for name in per_policy if self.policy_table[name].trainable] or list(per_policy)
        plain: dict[str, list[float]] = defaultdict(list)
        for name, values in per_policy.items():
            for key, value in values.items():
                metrics[f"policy/{name}/{key}"] = value
                if key != "rows" and name in trainable:
                    plain[key].append(value)
        metrics.update({key: float(np.mean(values)) for key, values in plain.items()})

    def _get_required_batch_multiple(self, dp_size: int) -> int:
        k = self.settings.trainer.mini_batches_per_step
        if k is None:
            return super()._get_required_batch_multiple(dp_size)
        return math.lcm(dp_size, self.config.actor_rollout_ref.rollout.n) * k

    def _update_actor(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        """verl's update, with the padding rows spread over its optimizer steps (``spread_padding``;
        ``actor/mini_batch_real_frac_min``: the smallest real-row share of a step; not with
        ``actor.shuffle``, where verl draws each rank's mini-batches at random); with
        ``trainer.mini_batches_per_step`` = K the policy's rows (padded to a multiple of K) are split
        into exactly K mini-batches, whatever the episodes' lengths."""
        actor = self.config.actor_rollout_ref.actor
        n = self.config.actor_rollout_ref.rollout.n
        k = self.settings.trainer.mini_batches_per_step
        if not actor.get("shuffle", False):  # shuffled, verl deals each rank's rows into mini-batches itself
            mini_batches = k if k is not None else len(batch) // (actor.ppo_mini_batch_size * n)
            order, metrics["actor/mini_batch_real_frac_min"] = spread_padding(
                [bool(tag.get("is_padding", False)) for tag in batch.tags], self._dp_size(), mini_batches
            )
            batch.reorder(order)
        with self._exactly_k_mini_batches(actor, len(batch)):
            return super()._update_actor(batch, metrics)

    def _compute_values(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        if self.critic_wg is not None:
            return super()._compute_values(batch, metrics)
        # a frozen policy has no critic: its rows, never trained, enter GAE's pass over the batch valued 0
        masks = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["response_mask"])["response_mask"]
        zeros = [{"values": torch.zeros(len(mask))} for mask in masks.unbind(0)]
        tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=list_of_dict_to_tensordict(zeros))
        return batch

    def _update_critic(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        with self._exactly_k_mini_batches(self.config.critic, len(batch)):
            return super()._update_critic(batch, metrics)

    @contextlib.contextmanager
    def _exactly_k_mini_batches(self, section, rows: int):
        """With ``trainer.mini_batches_per_step`` = K, ``section.ppo_mini_batch_size`` (actor or critic)
        set for the update so that its ``rows`` split into exactly K mini-batches."""
        k = self.settings.trainer.mini_batches_per_step
        if k is None:
            yield
            return
        configured = section.ppo_mini_batch_size
        with open_dict(section):
            section.ppo_mini_batch_size = rows // k // self.config.actor_rollout_ref.rollout.n
        try:
            yield
        finally:
            with open_dict(section):
                section.ppo_mini_batch_size = configured

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
        """One JSON line per training row of this step, as the advantage step saw it."""
        advantages = tq.kv_batch_get(keys=keys, partition_id=batch.partition_id, select_fields=["advantages"])["advantages"]
        os.makedirs(dump_dir, exist_ok=True)
        with open(os.path.join(dump_dir, f"step_{self.global_steps}.jsonl"), "w") as f:
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
        step_dir = os.path.join(self.config.trainer.default_local_dir, f"global_step_{self.global_steps}")
        if not self.config.trainer.get("val_only", False) and os.path.isdir(step_dir):
            path = os.path.join(step_dir, VAL_METRICS)
            files = self.config.data.val_files
            record = {"global_step": self.global_steps, "val_files": [files] if isinstance(files, str) else list(files), "metrics": metrics}
            write_whole(path, json.dumps(record, indent=1, default=float))  # default: numpy scalars
        return metrics

    # ------------------------------ checkpoints ------------------------------

    def _save_checkpoint(self):
        """``global_step_N/policies/<group>/`` per worker group (weights, optimizer, scheduler; the
        adapter group also each adapter in peft format), ``critics/<group>/`` per critic (gae) and the dataloader, written under a
        temporary name and renamed when complete; then the tracker file (renamed too), then older
        step folders beyond ``trainer.max_actor_ckpt_to_keep`` are removed. A run killed at any
        point leaves the last complete checkpoint named by the tracker, and no partial folder under
        a step's name."""
        trainer = self.config.trainer
        root = trainer.default_local_dir
        step_dir = os.path.join(root, f"global_step_{self.global_steps}")
        partial = step_dir + PARTIAL_SUFFIX
        shutil.rmtree(partial, ignore_errors=True)  # left by a run killed while saving this step
        for name, group in self.groups.items():
            for folder, workers in ((POLICIES_DIR, group.worker_group), (CRITICS_DIR, group.critic)):
                if workers is None:
                    continue
                remote = None if trainer.default_hdfs_dir is None else os.path.join(
                    trainer.default_hdfs_dir, f"global_step_{self.global_steps}", folder, name
                )
                # Retention is done below, over whole step folders: verl's would delete by the
                # temporary paths it was given.
                workers.save_checkpoint(os.path.join(partial, folder, name), remote, self.global_steps, max_ckpt_to_keep=None)
        os.makedirs(partial, exist_ok=True)
        torch.save(self.train_dataloader.state_dict(), os.path.join(partial, "data.pt"))
        if self.trainer_mode != "sync":  # the episodes under way (verl re-issues them on resume)
            tq.save_checkpoint(os.path.join(partial, QUEUE_DIR), metadata={"global_steps": self.global_steps})
        shutil.rmtree(step_dir, ignore_errors=True)  # a stale one (e.g. a run restarted from an earlier step)
        os.replace(partial, step_dir)
        tracker = os.path.join(root, "latest_checkpointed_iteration.txt")
        write_whole(tracker, str(self.global_steps))
        self._remove_old_checkpoints(trainer.get("max_actor_ckpt_to_keep", None))
        self.checkpoint_callback.on_save(trainer=self, global_step=self.global_steps, checkpoint_dir=step_dir, async_save=False)

    def _remove_old_checkpoints(self, keep: int | None) -> None:
        if not keep:
            return
        root = self.config.trainer.default_local_dir
        steps = sorted(int(name.split("_")[-1]) for name in os.listdir(root) if re.fullmatch(r"global_step_\d+", name))
        for step in steps[:-keep]:
            shutil.rmtree(os.path.join(root, f"global_step_{step}"), ignore_errors=True)

    def _load_checkpoint(self):
        self.global_steps = 0
        if not self.groups:
            return  # called inside verl's _setup, before the other groups exist; _setup calls it again
        step_dir = self._resume_folder()
        if step_dir is None:
            return
        self.global_steps = int(step_dir.split("global_step_")[-1])
        print(f"{self.mode}: resuming {sorted(self.groups)} from {step_dir} (step {self.global_steps})", flush=True)
        for name, group in self.groups.items():
            path = os.path.join(step_dir, POLICIES_DIR, name)
            if len(self.groups) == 1 and not os.path.isdir(path):
                path = os.path.join(step_dir, "actor")  # a one-policy checkpoint in verl's own layout
            if not os.path.isdir(path):
                raise FileNotFoundError(f"{path}: no checkpoint of group {name!r} in {step_dir} (was it added to {SECTION}.policies later?)")
            group.worker_group.load_checkpoint(local_path=path, del_local_after_load=self.config.trainer.del_local_ckpt_after_load)
            if group.critic is not None:
                path = os.path.join(step_dir, CRITICS_DIR, name)
                if not os.path.isdir(path):
                    raise FileNotFoundError(f"{path}: no critic of group {name!r} in {step_dir} (saved without one: train on from it "
                                            "with the estimator it was saved with, or start a run of its own with critic.enable=true)")
                group.critic.load_checkpoint(local_path=path, del_local_after_load=self.config.trainer.del_local_ckpt_after_load)
        data = os.path.join(step_dir, "data.pt")
        if os.path.exists(data):
            self.train_dataloader.load_state_dict(torch.load(data, weights_only=False))
        queue = os.path.join(step_dir, QUEUE_DIR)
        if self.trainer_mode != "sync" and os.path.exists(queue):
            # finished episodes come back as they were; those under way are played again from their
            # prompts in fit() (verl's _reissue_inflight_prompts), none trained twice nor lost
            tq.load_checkpoint(queue)
            self._restored_tq_prompt_count = _count_tq_prompt_groups()
            print(f"{self.mode}: {self._restored_tq_prompt_count} problems under way at step {self.global_steps} restored", flush=True)

    def _resume_folder(self) -> str | None:
        """The step folder to resume from (verl's resume_mode semantics), or None."""
        trainer = self.config.trainer
        if trainer.resume_mode == "disable":
            return None
        if trainer.resume_mode == "resume_path":
            if "global_step_" not in str(trainer.resume_from_path):
                raise ValueError(f"trainer.resume_from_path={trainer.resume_from_path!r}: name a global_step_N folder")
            return os.path.abspath(trainer.resume_from_path)
        if trainer.resume_mode != "auto":
            raise ValueError(f"trainer.resume_mode={trainer.resume_mode!r}: use auto, resume_path or disable")
        return find_latest_ckpt_path(os.path.abspath(trainer.default_local_dir))
