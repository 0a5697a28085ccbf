"""verl V1 agent-loop worker/manager for multi-agent episodes.

verl passes an agent loop no "this is validation" flag; the episode loop needs it (validation
runs one greedy episode, no tree, and a swapped-policy pass serves the swapped policies), so
this worker injects it. Each row's own reward and AT-GRPO group are put in place by the trainer
(``trainer/mas_trainer.py``), which owns the rows. Select it with
``actor_rollout_ref.rollout.agent.agent_loop_manager_class=pettingllms_verl.rollout.worker.MASAgentLoopManager``.
"""

from __future__ import annotations

import json

import ray
from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ, AgentLoopWorkerTQ

from pettingllms_verl.data.rows import EPISODE_AGENT
from pettingllms_verl.rollout.agent_loop import VALIDATE_KWARG
from pettingllms_verl.placement import PLACEMENT, nodes


class MASAgentLoopWorker(AgentLoopWorkerTQ.__ray_actor_class__):
    def __init__(self, *args, **kwargs):
        # Must be defined here: otherwise Ray ships verl's inherited __init__ by value, with a
        # by-value copy of its class in the `super()` cell, and that super() call fails.
        super().__init__(*args, **kwargs)

    async def _run_agent_loop(self, sampling_params, trajectory, *, agent_name, trace=True, **kwargs):
        if agent_name == EPISODE_AGENT:
            kwargs[VALIDATE_KWARG] = bool(trajectory["validate"])
        return await super()._run_agent_loop(sampling_params, trajectory, agent_name=agent_name, trace=trace, **kwargs)


class MASAgentLoopManager(AgentLoopManagerTQ):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.agent_loop_workers_class = ray.remote(MASAgentLoopWorker)
        self.worker_nodes: list[str] = []  # the Ray node of each agent-loop worker

    async def _init_agent_loop_workers(self):
        await super()._init_agent_loop_workers()  # verl places them round-robin over the nodes
        self.worker_nodes = nodes(self.agent_loop_workers)
        print(f"{PLACEMENT} {json.dumps({'episodes': self.worker_nodes})}", flush=True)
