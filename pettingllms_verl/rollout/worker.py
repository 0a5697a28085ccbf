"""verl V1 agent-loop worker/manager for multi-sample episodes.

verl's worker, given several outputs from one agent-loop run, copies the last output's reward
onto all earlier ones and stores the problem uid on every row (the uid becomes the advantage
estimator's ``index``). For AT-GRPO each sample keeps its own reward and is grouped by its
(problem, turn, role, node) key, so after verl stores the outputs this worker rewrites exactly
those two fields. Select it with
``actor_rollout_ref.rollout.agent.agent_loop_manager_class=pettingllms_verl.rollout.worker.MASAgentLoopManager``.
"""

from __future__ import annotations

from typing import Any

import ray
import transfer_queue as tq
from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ, AgentLoopWorkerTQ
from verl.utils.tensordict_utils import list_of_dict_to_tensordict

from pettingllms_verl.algo import AT_GRPO
from pettingllms_verl.data.rows import EPISODE_AGENT
from pettingllms_verl.rollout.agent_loop import VALIDATE_KWARG


class MASAgentLoopWorker(AgentLoopWorkerTQ.__ray_actor_class__):
    def __init__(self, *args, **kwargs):
        # Must be defined here: otherwise Ray ships verl's inherited __init__ by value, with a
        # by-value copy of its class in the `super()` cell, and that super() call fails.
        super().__init__(*args, **kwargs)

    async def _run_agent_loop(self, sampling_params, trajectory, *, agent_name, trace=True, **kwargs):
        if agent_name == EPISODE_AGENT:
            kwargs[VALIDATE_KWARG] = bool(trajectory["validate"])
        return await super()._run_agent_loop(sampling_params, trajectory, agent_name=agent_name, trace=trace, **kwargs)

    async def _agent_loop_postprocess(self, output, validate, **kwargs: Any) -> None:
        outputs = output if isinstance(output, list) else [output]
        regroup = (
            not validate
            and bool(outputs)
            and "mas_group" in outputs[0].extra_fields
            and self.config.algorithm.adv_estimator == AT_GRPO
        )
        own_rewards = [out.reward_score for out in outputs]
        await super()._agent_loop_postprocess(output, validate, **kwargs)
        if not regroup:
            return
        for out, reward in zip(outputs, own_rewards):
            out.reward_score = reward  # undo verl's copy of the last reward
        # Same key scheme as verl's postprocess: {uid}_{session_id}_{index}.
        keys = [f"{kwargs['uid']}_{kwargs['session_id']}_{i}" for i in range(len(outputs))]
        fields = [{"rm_scores": out.as_dict()["rm_scores"], "uid": out.extra_fields["mas_group"]} for out in outputs]
        await tq.async_kv_batch_put(keys=keys, fields=list_of_dict_to_tensordict(fields), partition_id="train")


class MASAgentLoopManager(AgentLoopManagerTQ):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.agent_loop_workers_class = ray.remote(MASAgentLoopWorker)

