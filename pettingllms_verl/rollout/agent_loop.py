"""verl agent loop ``pettingllms_episode``: one dataset row -> one multi-agent episode -> one
training sample per (turn, role, branch), each with its own reward and group tags.

Rows come from ``pettingllms_verl.data.rows.task_row`` (the env name and task travel in
``extra_info``). The loop knows no environment: it builds it by name, renders its chat messages
with the tokenizer's template, and hands replies back as text. With ``pettingllms.program`` set,
a team program plays the task instead, through the gateway (``programs/``): its agents are the roles.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
import traceback
import uuid
from dataclasses import replace
from typing import Any

import ray
from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, register

from pettingllms_verl import envs
from pettingllms_verl.programs.episode import DIVERGED_NODE, Reply, assistant_reply, play_program
from pettingllms_verl.programs.gateway import ChatRequest, gateway
from pettingllms_verl.config import ROW_TEMPERATURE, PettingLLMsConfig, load
from pettingllms_verl.algo import AT_GRPO
from pettingllms_verl.data.rows import EPISODE_AGENT, row_task
from pettingllms_verl.envs.images import chat_inputs, data_uri
from pettingllms_verl.rollout.codecs import Codec, codecs_of
from pettingllms_verl.episodes.core import NODE_TRIES, EngineDead, Episode, PromptTooLong, Sample, episode_return, run_episode
from pettingllms_verl.rollout.faults import TRACEBACK_CHARS
from pettingllms_verl.episodes.tags import SWAPPED_KWARG
from pettingllms_verl.targets import load_target

logger = logging.getLogger(__name__)
VALIDATE_KWARG = "pettingllms_validate"  # injected by MASAgentLoopWorker: verl passes no such flag to run()
_logged_causes: set[str] = set()  # each cause's first traceback is logged once per process


def reply_versions(extra_fields: dict[str, Any]) -> set[int]:
    """The weight versions one reply's tokens came from: verl's asynchronous client reports the first
    and last of a request asked again across a weight push (``min_global_steps``, ``global_steps``)."""
    return {v for v in (extra_fields.get("min_global_steps"), extra_fields.get("global_steps")) if v is not None}


def group_key(uid: str, session_id: int, sample: Sample, settings: PettingLLMsConfig) -> str:
    """AT-GRPO group of a sample: (problem uid, turn, role, tree node).

    In tree mode the node is a state inside one session's tree, so the session is part of it;
    independent episodes (K = 1) of one problem share (turn, role) groups across sessions. A
    placeholder (an episode that failed before its first reply) is a group of its own: its zero
    reward must not enter the mean and std of the replies it stands beside.
    ``settings.group_by`` keeps some of the parts beside the problem; ``[]`` keys by problem alone.
    """
    if sample.placeholder:
        return f"{uid}|s{session_id}|placeholder"
    parts = {
        "turn": f"t{sample.turn}",
        "role": sample.role,
        # a diverged replay's calls (programs/episode.py) train as an independent run's
        "node": f"s{session_id}:{sample.node}" if settings.rollout_mode == "tree" and sample.node != DIVERGED_NODE else "indep",
    }
    return "|".join([uid, *(parts[name] for name in settings.group_by)])


# Registered here as well as by dotted name in registration.register(): a worker whose first verl import
# happens inside this package's own import (Ray unpickling rollout/worker.py) has register() skip itself
# (registration._own_import_in_progress), and this is then what registers the loop in that process.
@register(EPISODE_AGENT)
class EpisodeAgentLoop(AgentLoopBase):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.settings = load(self.config.get("pettingllms"))
        for name, target in self.settings.envs.items():  # the run's own environments, in this worker too
            envs.register_env(name, target)
        self.rewards = {role: load_target(config.reward) for role, config in self.settings.roles.items() if config.reward}
        self.prompt_length = int(self.rollout_config.prompt_length)
        self.response_length = int(self.rollout_config.response_length)
        # each policy's tokenizer: the first group's is this worker's; a policy of another model family has its own
        self.codecs = codecs_of(self.settings, self.rollout_config, Codec(self.tokenizer, self.processor))

    def render(self, codec: Codec, messages: list[dict[str, Any]], tools: list[dict] | None = None) -> list[int]:
        ids = chat_inputs(codec.tokenizer, codec.processor, messages, tools, **self.apply_chat_template_kwargs)["input_ids"]
        if len(ids) > self.prompt_length:
            raise PromptTooLong(
                f"pettingllms_episode: a {len(ids)}-token prompt exceeds data.max_prompt_length="
                f"{self.prompt_length}; raise it (and rollout.prompt_length follows) or shorten the env's prompt"
            )
        return list(ids)

    def _reply(self, codec: Codec, token_ids: list[int], log_probs: list[float]) -> tuple[list[int], list[float]]:
        """A sampled reply as it is trained: within the response budget, and ended before the first
        image or video placeholder a vision-language model wrote (a row's placeholders must be its
        prompt's images; the tokens before it keep their log-probs, as a reply cut at max_tokens does)."""
        end = min(len(token_ids), self.response_length)
        end = next((i for i, token in enumerate(token_ids[:end]) if token in codec.media_placeholders), end)
        return list(token_ids[:end]), list(log_probs[:end])

    def _sampling(self, base: dict[str, Any], role: str, validate: bool, call: dict[str, Any] | None = None) -> dict[str, Any]:
        """verl's sampling params with the role's overrides, then a program call's own values (``call``)."""
        params = {**base, **self.settings.sampling_overrides(role, validate), **(call or {})}
        params["max_tokens"] = min(int(params.get("max_tokens", self.response_length)), self.response_length)
        return params

    def _scoring_temperature(self, base: dict[str, Any], role: str, validate: bool) -> float:
        """The temperature a role's replies are scored at in training: the one they were sampled
        at; greedy replies (temperature <= 0) at 1, as the rollouts record their log-probs."""
        temperature = float(self._sampling(base, role, validate).get("temperature", 1.0))
        return temperature if temperature > 0 else 1.0

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> list[AgentLoopOutput]:
        validate = bool(kwargs.get(VALIDATE_KWARG, False))
        started_at = time.time()
        name, seed, task = row_task(kwargs["extra_info"])
        program = self.settings.program.enabled
        if program:
            env, workflow, turn_order = None, None, tuple(self.settings.roles)  # a program's agents
        else:
            env = envs.make(name, **self.settings.env_kwargs)
            env.reset(seed=seed, task=task)
            workflow = env.workflow(self.settings.workflow)
            turn_order = workflow.turn_order

        # One request id per episode: the load balancer keeps an episode's K branches and later
        # turns on one replica of each policy (its prefix cache), and the policy's router picks it.
        request_id = uuid.uuid4().hex
        swapped = validate and bool(kwargs.get(SWAPPED_KWARG, False))
        policies = {role: self.settings.policy_of(role, swapped=swapped) for role in turn_order}
        codecs = {role: self.codecs[policy] for role, policy in policies.items()}  # a role's prompts and replies in its policy's tokens
        weight_versions: dict[str, set] = {role: set() for role in policies}  # global step of the weights behind each reply
        served_by: dict[str, set] = {role: set() for role in policies}  # the policy each server says it is
        resampled = [0]  # tree nodes sampled again: their branches had come from two weight versions

        async def generate(role: str, prompt_ids: list[int], n: int, params: dict | None = None, images: list | None = None):
            replies, versions = await sample_versions(role, prompt_ids, n, params, images)
            weight_versions[role].update(versions)  # an environment's replies all train (a program's: those its samples keep)
            return replies

        async def sample_versions(role: str, prompt_ids: list[int], n: int, params: dict | None = None, images: list | None = None):
            """``n`` replies of ``role`` to one prompt, from one weight version where it can, and the
            versions they came from."""
            params = params or self._sampling(sampling_params, role, validate)
            media = {"image_data": images} if images else {}
            for attempt in range(NODE_TRIES):
                try:
                    outputs = await asyncio.gather(
                        *(
                            self.server_manager.generate(
                                request_id=request_id, prompt_ids=prompt_ids, sampling_params=params, policy=policies[role], **media
                            )
                            for _ in range(n)
                        )
                    )
                except ray.exceptions.ActorUnavailableError:
                    raise  # a server Ray is restarting or cannot reach for now: this request's fault alone
                except ray.exceptions.RayActorError as error:  # the actor died: Ray's message names it and its exit cause
                    raise EngineDead(f"policy {policies[role]!r} (role {role}): its rollout server is dead. {error}") from error
                versions = {version for out in outputs for version in reply_versions(out.extra_fields)}
                # An asynchronous trainer pushes weights between steps, and a node's K branches are one
                # AT-GRPO group: all of them from one version, or the node is sampled again.
                if len(versions) <= 1 or attempt == NODE_TRIES - 1:
                    break
                resampled[0] += 1
            for out in outputs:
                served_by[role].add(out.extra_fields.get("policy"))
            return [self._reply(codecs[role], out.token_ids, out.log_probs or []) for out in outputs], versions

        def render(role: str, messages: list[dict[str, Any]], tools: list[dict] | None = None) -> list[int]:
            return self.render(codecs[role], messages, tools)

        def decode(role: str, ids: list[int]) -> str:
            return codecs[role].decode(ids)

        if program:
            problem = {"env": name, "seed": seed, "task": task, "env_kwargs": dict(self.settings.env_kwargs)}
            episode = await self._play_program(problem, sampling_params, validate, sample_versions, render, codecs)
            resampled[0] += episode.program["resampled_nodes"]
            for sample in episode.samples:  # the versions of the calls that train, not of runs a resampled node dropped
                weight_versions[sample.role].update(sample.versions)
        else:
            episode = await run_episode(
                env,
                workflow.turn_order,
                workflow.max_turns,
                k=self.settings.branches(validate),
                alpha=self.settings.alpha,
                generate=generate,
                render=render,
                decode=decode,
                snapshots=bool(self.settings.paths.episode_log_dir),
                rewards=self.rewards,
            )
        # verl's staleness bookkeeping, per row: which weight versions its role's replies came from (a
        # frozen policy's weights never change version: its rows count the episode's learning roles').
        table = self.settings.policy_table()
        learning = [role for role, policy in policies.items() if table[policy].trainable] or list(policies)
        episode_versions = {v for role in learning for v in weight_versions[role]}

        def versions(role: str) -> dict[str, int | None]:
            known = weight_versions[role] if role in learning else episode_versions
            return {"min_global_steps": min(known, default=None), "max_global_steps": max(known, default=None)}
        # per role, what the servers that answered it reported (their policy and weight version), and
        # the temperature its replies were sampled at: the trainer's log-probs of its rows use it
        routing = {
            role: {
                "mas_policy": policy,
                "mas_served_by": sorted(map(str, served_by[role])),
                "mas_weight_versions": sorted(weight_versions[role]),
                ROW_TEMPERATURE: self._scoring_temperature(sampling_params, role, validate),
            }
            for role, policy in policies.items()
        }
        self._log_fault(episode, name)
        if self.settings.paths.episode_log_dir:
            served = {role: routing[role]["mas_served_by"] for role in routing}
            self._write_log(self.settings.paths.episode_log_dir, name, seed, task, validate, swapped, policies, served, episode, started_at,
                            codecs)
        if not episode.samples:  # ended before its first reply: one untrained row carries the episode's end
            episode.samples.append(self._placeholder(turn_order[0], codecs[turn_order[0]]))
        if validate:
            # Validation reports what evaluation means: episode success, one row per episode.
            final = episode.samples[-1]
            extra = {**versions(final.role), **routing[final.role]}
            return [self._output(final, kwargs, episode, extra, reward=float(episode.success), last=True)]
        samples = episode.samples
        outputs = [
            self._output(s, kwargs, episode, {**versions(s.role), **routing[s.role], "mas_resampled_nodes": resampled[0],
                                               "mas_straddled": len(episode_versions) > 1},
                         reward=s.reward, last=i == len(samples) - 1)
            for i, s in enumerate(samples)
        ]
        if self.config.algorithm.adv_estimator != AT_GRPO:
            # Trajectory-level estimators (verl's GRPO) read the last output of a session: give it
            # the episode's return (final team reward once + mean role reward; see episode_return).
            outputs[-1].reward_score = episode_return(samples, episode.final_global_reward, self.settings.alpha)
        return outputs

    async def _play_program(self, problem: dict, sampling_params: dict[str, Any], validate: bool, sample_versions, render,
                            codecs: dict[str, Codec]) -> Episode:
        """An episode of the recipe's team program (``programs/episode.py``): each call it makes
        through the gateway is rendered with its agent's policy's chat template, sampled by that
        policy and answered as a chat completion (tool calls parsed by verl's tool parser), with
        the weight version it came from (a tree node's K runs are held to one)."""
        config = self.settings.program
        door = await gateway(config.host, config.max_request_bytes)

        async def sample(request: ChatRequest, n: int, prompt_ids: list[int]) -> Reply:
            params = self._sampling(sampling_params, request.agent, validate, request.sampling)
            ((ids, log_probs),), versions = await sample_versions(request.agent, prompt_ids, 1, params)
            codec = codecs[request.agent]
            parser = codec.tool_parser(self.rollout_config.multi_turn.format) if request.tools else None
            reply = await assistant_reply(request, n, list(ids), list(log_probs), params["max_tokens"], codec.decode, parser,
                                          codec.tokenizer.all_special_tokens)
            return replace(reply, versions=frozenset(versions))

        return await play_program(config, problem, list(self.settings.roles), self.settings.branches(validate), self.settings.alpha,
                                  door, render, sample)

    def _write_log(
        self, directory: str, env_name: str, seed: int, task: dict, validate: bool, swapped: bool, policies: dict,
        served_by: dict, episode: Episode, started_at: float, codecs: dict[str, Codec],
    ) -> None:
        """Append the episode as one JSON line to ``<directory>/episodes-<pid>.jsonl`` (one file per
        process: no two writers share a file). Model text is stored as it came: escape it to show it."""
        prompts: dict[int, str] = {}  # the K branches of a node share one prompt list: decode it once
        images: dict[int, list[str]] = {}  # and one image list: encode it once
        samples = [
            {
                "turn": s.turn, "role": s.role, "policy": policies.get(s.role), "node": s.node, "branch": s.branch,
                "chosen": s.chosen, "placeholder": s.placeholder, "parse_ok": s.parse_ok,
                "local_reward": s.local_reward, "global_reward": s.global_reward, "reward": s.reward,
                "prompt": prompts.setdefault(id(s.prompt_ids), codecs[s.role].tokenizer.decode(s.prompt_ids)),
                **({"images": images.setdefault(id(s.images), [data_uri(image) for image in s.images])} if s.images else {}),
                "reply": codecs[s.role].decode(s.response_ids), "info": s.info, "state": s.snapshot,
            }
            for s in episode.samples
        ]
        record = {
            "env": env_name, "seed": seed, "task": task, "validate": validate, "swapped": swapped, "policies": policies, "served_by": served_by,
            "models": {role: str(codec.tokenizer.name_or_path) for role, codec in codecs.items()},  # each role's tokenizer (its model family)
            "workflow": "program" if self.settings.program.enabled else self.settings.workflow,
            "program": episode.program,  # a team program's runs, replayed calls and diverged replays (None: an env's episode)
            "success": episode.success, "end_cause": episode.end_cause, "error": self._error_text(episode), "turns": episode.turns,
            "final_global_reward": episode.final_global_reward, "started_at": started_at, "finished_at": time.time(),
            "start": episode.start, "samples": samples,
        }
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, f"episodes-{os.getpid()}.jsonl"), "a", encoding="utf-8") as f:
            f.write(json.dumps(record, ensure_ascii=False, default=str) + "\n")  # default: an env's odd info value as text

    @staticmethod
    def _error_text(episode: Episode) -> str | None:
        """The traceback of what ended the episode (its end: the cause is at the bottom), or None."""
        if episode.error is None:
            return None
        return "".join(traceback.format_exception(episode.error))[-TRACEBACK_CHARS:]

    @classmethod
    def _log_fault(cls, episode: Episode, env_name: str) -> None:
        if episode.error is None or episode.end_cause in _logged_causes:
            return
        _logged_causes.add(episode.end_cause)
        logger.warning(f"pettingllms_episode: a {env_name} episode ended by {episode.end_cause} (first of its kind "
                       f"in this process; counted in mas/episode_errors or mas/truncated):\n{cls._error_text(episode)}")

    @staticmethod
    def _placeholder(role: str, codec: Codec) -> Sample:
        """A row for an episode that produced no sample: counted in the episode metrics, masked out
        of training (its response mask is zero, its group a singleton); a token of the role's policy."""
        token = codec.tokenizer.eos_token_id if codec.tokenizer.eos_token_id is not None else 0
        return Sample(prompt_ids=[token], response_ids=[token], log_probs=[0.0], turn=0, role=role, node="", branch=0,
                      local_reward=0.0, global_reward=0.0, reward=0.0, parse_ok=False, placeholder=True)

    def _output(
        self, sample: Sample, kwargs: dict, episode: Episode, extra: dict, reward: float, last: bool
    ) -> AgentLoopOutput:
        tags = {
            "mas_group": group_key(str(kwargs["uid"]), int(kwargs.get("session_id", 0)), sample, self.settings),
            "mas_turn": sample.turn,
            "mas_role": sample.role,
            "mas_node": sample.node,
            "mas_branch": sample.branch,
            "mas_local_reward": sample.local_reward,
            "mas_global_reward": sample.global_reward,
            "mas_reward": reward,
            "mas_parse_ok": sample.parse_ok,
            "mas_chosen": sample.chosen,
            # episode-level facts, carried by the episode's last sample only
            "mas_episode_end": last,
            "mas_success": episode.success if last else None,
            "mas_end_cause": episode.end_cause if last else None,  # None: the env finished it (episode.TRUNCATIONS, ERRORS)
            "mas_error": self._error_text(episode) if last else None,  # what ended it (rollout/faults.py quotes the first of each cause)
            "mas_placeholder": sample.placeholder,
            "mas_sandbox_runs": sample.sandbox_runs,  # {sandbox status: runs} of this reply's programs
            "mas_images": len(sample.images or ()),  # images in the prompt (a role shown the state drawn)
            "mas_turns": episode.turns if last else None,
            "mas_env_s": episode.env_s if last else None,
            "mas_generate_s": episode.generate_s if last else None,
            "mas_program": episode.program if last else None,  # a team program's runs, replayed calls, diverged replays
            # verl's postprocess copies this from the last output (a reward manager fills it)
            "reward_extra_info": {},
            **extra,  # verl's staleness fields + this role's routing (mas_policy, mas_served_by, ...)
        }
        if sample.temperature is not None:  # a program's call set its own
            tags[ROW_TEMPERATURE] = sample.temperature
        return AgentLoopOutput(
            prompt_ids=sample.prompt_ids,
            response_ids=sample.response_ids,
            response_mask=[0 if sample.placeholder else 1] * len(sample.response_ids),
            response_logprobs=sample.log_probs or None,
            # verl's postprocess turns these into the row's image inputs and multimodal positions
            multi_modal_data={"images": sample.images} if sample.images else None,
            reward_score=reward,
            num_turns=2,
            metrics=AgentLoopMetrics(),
            extra_fields=tags,
        )
