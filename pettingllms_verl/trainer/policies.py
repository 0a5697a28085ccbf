"""Several policies in one run: the routing table's runtime side.

A worker group is one FSDP actor + its rollout replicas + their weight sync, built from the
trainer config (``config.policy_config``). A full-model policy is a group of its own, with its
``overrides`` merged into ``actor_rollout_ref``; the LoRA-adapter policies share the group
``lora`` on the base model, an adapter each. L0 is the table of one policy; L1 one adapter per
role; L2 one group per role. The rollout knows only "role -> policy name": ``PolicyRouterClient``
turns the name into that policy's group's load balancer (and its adapter).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig
from verl.checkpoint_engine import CheckpointEngineManager
from verl.workers.rollout.llm_server import LLMServerClient, LLMServerManager


@dataclass
class PolicyGroup:
    name: str  # a full-model policy's name, or "lora" for the adapter policies' group
    trainable: bool  # any of its policies is trainable
    config: DictConfig  # the whole trainer config as this policy sees it (config.policy_config)
    worker_group: Any  # RayWorkerGroup of ActorRolloutRefWorker: old log-probs, updates, checkpoints
    servers: LLMServerManager  # its rollout replicas and their load balancer
    sync: CheckpointEngineManager  # pushes its actor's weights to its replicas
    synced: bool = False  # a frozen group is synced once (after loading a checkpoint), then never again
    adapters: tuple[str, ...] = ()  # the adapter policies of the group (L1); () for a full model
    critic: Any = None  # RayWorkerGroup of verl's value-model TrainingWorker (gae), in the actor's processes; None without one
    tokenizer: Any = None  # its model's tokenizer where the group was built apart from verl's own (None: the trainer's)


class PolicyRouterClient(LLMServerClient):
    """verl's LLM client over the groups; ``generate(..., policy=name)`` goes to that policy's
    group's replicas, naming its adapter (``adapter=``) when the policy is one."""

    def __init__(self, config: DictConfig, clients: dict[str, LLMServerClient], routes: dict[str, tuple[str, str | None]]):
        super().__init__(config=config, load_balancer_handle=None)
        self.clients = clients  # group -> its load balancer's client
        self.routes = routes  # policy -> (group, adapter or None)

    async def generate(self, request_id, *, policy: str | None = None, **kwargs: Any):
        # `policy` must not reach the server: verl forwards unknown kwargs to server.generate.
        if policy is None and len(self.routes) == 1:
            policy = next(iter(self.routes))
        if policy not in self.routes:
            raise KeyError(f"no policy {policy!r} in this run; policies: {sorted(self.routes)}")
        group, adapter = self.routes[policy]
        if adapter is not None:
            kwargs["adapter"] = adapter
        output = await self.clients[group].generate(request_id, **kwargs)
        # the hf server stamps the policy it serves; verl's vLLM/SGLang servers do not: the router's word then
        output.extra_fields.setdefault("policy", policy)
        return output


class MultiCheckpointManager:
    """The trainer's weight-sync hooks over every policy: sleep all replicas; after a step, push
    every trainable policy's weights to its replicas (frozen ones once, at start or resume)."""

    def __init__(self, groups: list[PolicyGroup]):
        self.groups = groups

    def sleep_replicas(self) -> None:
        for group in self.groups:
            group.sync.sleep_replicas()

    def abort_replicas(self, reject_request: bool = False) -> None:
        """Pause every policy's generation (asynchronous trainers, before the step trains): the
        episodes under way wait, and each request goes on after ``resume_generation_replicas``."""
        for group in self.groups:
            group.sync.abort_replicas(reject_request=reject_request)

    def resume_generation_replicas(self) -> None:
        for group in self.groups:
            group.sync.resume_generation_replicas()

    def update_weights(self, global_steps: int | None = None) -> dict:
        for group in self.groups:
            if group.trainable or not group.synced:
                group.sync.update_weights(global_steps)  # the actor's update_weights also wakes the replicas
                group.synced = True
            else:
                group.sync.wake_up_replicas()  # a frozen policy slept with the others after sampling
        return {}
