"""One training episode through the real agent loop (``EpisodeAgentLoop.run``), served by a
scripted stand-in for the rollout server."""

import asyncio

from omegaconf import OmegaConf
from verl.experimental.agent_loop.agent_loop import DictConfigWrap
from verl.workers.rollout.replica import TokenOutput

from pettingllms_verl.data.rows import task_row
from pettingllms_verl.rollout.agent_loop import EpisodeAgentLoop

K = 2


class ScriptedServer:
    """Answers every request with one fixed reply; raises ``error`` (default: a failed request) from
    request ``fail_from`` on."""

    def __init__(self, tokenizer, fail_from: int | None = None, error: Exception | None = None):
        self.reply = tokenizer.encode("no idea")  # unparseable: no move, the episode never ends by itself
        self.calls, self.fail_from, self.request_ids = 0, fail_from, []
        self.error = error or RuntimeError("the engine failed this batch")

    async def generate(self, request_id, prompt_ids, sampling_params, policy=None):
        self.calls += 1
        self.request_ids.append(request_id)
        if self.fail_from is not None and self.calls >= self.fail_from:
            raise self.error
        return TokenOutput(token_ids=self.reply, log_probs=[-0.5] * len(self.reply), extra_fields={"policy": policy, "global_steps": 0})


class ReplyingServer(ScriptedServer):
    """Answers every request with ``reply``; calls ``before_first`` once, before the first answer."""

    def __init__(self, tokenizer, reply: str, before_first=None):
        super().__init__(tokenizer)
        self.reply, self.before_first = tokenizer.encode(reply), before_first

    async def generate(self, request_id, prompt_ids, sampling_params, policy=None):
        if self.calls == 0 and self.before_first is not None:
            self.before_first()
        return await super().generate(request_id, prompt_ids, sampling_params, policy)


def play_env(tokenizer, server, env: str, task: dict, settings: dict | None = None, response_length: int = 16, rollout: dict | None = None,
             **env_kwargs) -> list:
    """One training episode of ``env`` on ``task`` through the real agent loop (``rollout``: more of
    the rollout's config, e.g. ``custom``)."""
    config = OmegaConf.create({
        "actor_rollout_ref": {"rollout": {"prompt_length": 1024, "response_length": response_length, **(rollout or {})}},
        "algorithm": {"adv_estimator": "at_grpo"},
        "pettingllms": {"k": K, "env_kwargs": env_kwargs, **(settings or {})},
    })
    row = task_row(env, 3, task, "train", 0)

    async def episode():
        loop = EpisodeAgentLoop(DictConfigWrap(config), server, tokenizer, None, None, DictConfigWrap(OmegaConf.create({})))
        return await loop.run({"temperature": 1.0}, extra_info=row["extra_info"], uid="problem", session_id=0)

    return asyncio.run(episode())
