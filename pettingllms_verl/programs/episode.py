"""One episode of a team program: its model calls as training samples, K runs per tree node.

A call is keyed by (agent, n): the agent its ``model`` names and how many calls that agent made
before it in the same run (its turn). Every call of a run becomes a ``Sample`` (role = agent,
turn = n) whose reward is the run's: the agent's own where the program returns rewards per agent,
else ``alpha`` times the team reward (``program.Outcome``).

Independent mode (K = 1): one run per episode; verl's ``rollout.n`` episodes of a problem group
their calls by (problem, n, agent). A run that fails (``program.ProgramFailed``, an engine fault)
loses its episode: without a reward its calls cannot be trained. One stopped at its own call or time
limit (``LIMITS``) is rewarded ``program.limit_reward`` instead where that is set: a truncation.

Tree mode (K > 1), by replay: node 0 is K runs from scratch, each a branch of the program's first
call. The best branch (highest reward of that call's agent, lowest index on ties) is the chosen
run; node j + 1 branches at the chosen run's next call (in the order its calls arrived): the chosen
run itself is branch 0 (its reply there was sampled afresh), and K - 1 new runs replay the chosen
run's first j + 1 calls from a cache (served without sampling) and sample from that call on. A node's
samples are its K branch calls; the calls after them are how each branch is scored (by its run's
reward), not samples. This needs no change to the program, only that it be replayable: given the
same replies, it makes the same calls with the same messages (no unseeded randomness, no clock or
random ids in prompts; agents may run concurrently, each agent's calls in a fixed order). A
replay that asks something else at a cached call, or does not reach the node's call with the same
prompt, diverged: it is counted (``Episode.program['diverged']``), leaves the node, and its own
sampled calls train as an independent run's (node ``"x"``, grouped by problem, n and agent).
Under an asynchronous trainer a node's K branch calls come from one weight version: where a push
split them (branch 0's call was sampled by a run before it), the node's K runs are played again from
its prefix, at most ``NODE_TRIES`` times (``Episode.program['resampled_nodes']``).
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Awaitable, Callable, Sequence

from pettingllms_verl.programs.gateway import ChatRequest, Gateway, GatewayError, completion
from pettingllms_verl.programs.program import Outcome, ProgramFailed, outcome, run_program, run_slot
from pettingllms_verl.config import ProgramConfig
from pettingllms_verl.episodes.core import NODE_TRIES, EngineDead, Episode, PromptTooLong, Sample, best_branch
from pettingllms_verl.episodes.tags import ERRORS
from pettingllms_verl.targets import load_target

DIVERGED_NODE = "x"  # the node of a diverged replay's calls: trained as an independent run's
LIMITS = ("program_call_limit", "program_timeout")  # a run's own limits: a truncation where program.limit_reward is set
# the calls' prompts are rendered here, off the event loop, one at a time (one tokenizer user: a fast
# tokenizer changing its truncation for one call would fail another's), in the order the calls came
RENDERS = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pettingllms-render")


@dataclass
class Reply:
    """A sampled reply: token ids and log-probs as the engine gave them, the assistant message the
    program receives, the temperature it was sampled at when the program set one, and the weight
    versions its tokens came from (where the server reports them: an asynchronous trainer's)."""

    response_ids: list[int]
    log_probs: list[float]
    message: dict
    finish_reason: str
    temperature: float | None = None
    versions: frozenset[int] = frozenset()


async def assistant_reply(request: ChatRequest, n: int, ids: list[int], log_probs: list[float], max_tokens: int,
                          decode: Callable[[list[int]], str], parser: Any, special_tokens: Sequence[str] = ()) -> Reply:
    """The sampled ids of call ``n`` as the program receives them: the decoded text, or, where the
    request offered tools and the tool parser (verl's ``ToolParser``) finds calls in the ids, those
    calls as ``tool_calls`` (ids ``call_<agent>_<n>_<i>``: the same on a replay) beside the rest of
    the text. ``finish_reason``: tool_calls, length (the reply used its whole budget) or stop."""
    message: dict[str, Any] = {"role": "assistant", "content": decode(ids)}
    finish = "length" if len(ids) >= max_tokens else "stop"
    if request.tools and parser is not None:
        content, calls = await parser.extract_tool_calls(ids, request.tools)
        if calls:
            for token in special_tokens:  # the parser decodes them; the program gets text
                content = content.replace(token, "")
            message = {"role": "assistant", "content": content.strip() or None, "tool_calls": [
                {"id": f"call_{request.agent}_{n}_{i}", "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for i, c in enumerate(calls)
            ]}
            finish = "tool_calls"
    temperature = request.sampling.get("temperature")
    return Reply(ids, log_probs, message, finish, None if temperature is None else (temperature if temperature > 0 else 1.0))


# (agent, messages, tools) -> prompt token ids, exactly as the agent's policy's template gives them; raises PromptTooLong
Render = Callable[[str, list[dict], list[dict] | None], list[int]]
# (request, call number, prompt ids) -> one reply of the request's agent
SampleReply = Callable[[ChatRequest, int, list[int]], Awaitable[Reply]]


@dataclass
class Call:
    agent: str
    n: int  # the agent's calls before this one in the run (its turn)
    request: ChatRequest
    prompt_ids: list[int]
    reply: Reply
    replayed: bool  # served from the replay cache, not sampled in this run
    generate_s: float = 0.0


@dataclass
class Run:
    """One program run behind one gateway session: numbers the calls, serves a replayed prefix,
    samples and records the rest. It is the session's handler."""

    agents: tuple[str, ...]
    max_calls: int
    render: Render
    sample: SampleReply
    prefix: dict[tuple[str, int], Call] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)  # in order of arrival
    diverged: bool = False
    closed: bool = False  # the run has ended: a call still in flight is answered 404 and recorded nowhere
    fault: tuple[str, BaseException] | None = None  # (cause, error): an engine fault, a call over max_calls, a prompt over budget
    _counts: dict[str, int] = field(default_factory=dict)

    async def __call__(self, request: ChatRequest) -> dict:
        agent = request.agent
        n = self._counts.get(agent, 0)
        self._counts[agent] = n + 1
        if sum(self._counts.values()) > self.max_calls:
            error = GatewayError(429, f"this run made more than pettingllms.program.max_calls={self.max_calls} calls", "call_limit")
            self.fault = self.fault or ("program_call_limit", error)
            raise error
        try:  # off the event loop: a program may send megabytes (seconds of template and tokenizer), the other episodes go on
            prompt_ids = await asyncio.get_running_loop().run_in_executor(RENDERS, self.render, agent, request.messages, request.tools)
        except PromptTooLong as error:
            self.fault = self.fault or ("prompt_overflow", error)
            raise GatewayError(400, str(error), "context_length_exceeded") from None
        except Exception as error:  # the chat template refuses these messages (a role order it does not know, ...)
            raise GatewayError(400, f"the policy's chat template cannot render these messages: {error!r}") from None
        cached = None if self.diverged else self.prefix.get((agent, n))
        if cached is not None and cached.prompt_ids != prompt_ids:
            self.diverged, cached = True, None  # asked something else given the same replies: not replayable
        if cached is not None:
            call = Call(agent, n, request, prompt_ids, cached.reply, replayed=True)
        else:
            started = time.perf_counter()
            try:
                reply = await self.sample(request, n, prompt_ids)
            except Exception as error:
                self.fault = self.fault or ("engine_dead" if isinstance(error, EngineDead) else "engine_error", error)
                raise GatewayError(500, f"the model call failed: {error!r}", "server_error") from None
            call = Call(agent, n, request, prompt_ids, reply, replayed=False, generate_s=time.perf_counter() - started)
        if self.closed:  # the program ended (or gave up on this call) while it was sampled
            raise GatewayError(404, "this run has ended", "not_found")
        self.calls.append(call)
        return completion(agent, f"{agent}-{n}", call.reply.message, call.reply.finish_reason, len(prompt_ids), len(call.reply.response_ids))

    def keyed(self) -> dict[tuple[str, int], Call]:
        return {(call.agent, call.n): call for call in self.calls}


@dataclass
class Finished:
    run: Run
    outcome: Outcome | None  # None: the run failed (``fault``)
    fault: tuple[str, BaseException] | None
    wall_s: float


async def _run_once(config: ProgramConfig, task: dict, agents: tuple[str, ...], door: Gateway, render: Render,
                    sample: SampleReply, prefix: dict[tuple[str, int], Call]) -> Finished:
    async with run_slot(config.max_parallel_runs):  # the wait for a slot is neither the run's time limit nor its time
        run = Run(agents, config.max_calls, render, sample, prefix)
        base_url, token = door.open(agents, run)
        started = time.perf_counter()
        try:
            value = await run_program(config, task, base_url, token)
            if config.reward:
                transcript = [{"agent": c.agent, "n": c.n, "messages": c.request.messages, "reply": c.reply.message} for c in run.calls]
                value = load_target(config.reward)(task=task, transcript=transcript, output=value)
            result = outcome(value, agents, config.success_at)
            fault = run.fault
            if fault is None and not run.calls:
                fault = ("program_no_call", ProgramFailed("program_no_call", "the program made no model call"))
        except ProgramFailed as error:
            result, fault = None, run.fault or (error.cause, error)  # the engine's fault first: it is why the program failed
        except Exception as error:  # the user's reward function
            result, fault = None, run.fault or ("program_error", error)
        finally:
            run.closed = True
            door.close(token)  # from here its token is unknown: a late call is answered 404, recorded nowhere
        if fault is not None and fault[0] in LIMITS and config.limit_reward is not None and run.calls:
            # a truncation its calls learn from (a team that loops is penalised, not dropped); what the program said is not asked
            result = Outcome(config.limit_reward, {agent: config.limit_reward for agent in agents}, False)
            fault = ("program_limit", fault[1])
        if fault is not None and fault[0] in ERRORS:
            result = None
        return Finished(run, result, fault, time.perf_counter() - started)


def _sample(call: Call, node: str, branch: int, reward: float, outcome_: Outcome, alpha: float) -> Sample:
    team = alpha * outcome_.team if outcome_.agents is None else 0.0
    return Sample(
        prompt_ids=call.prompt_ids, response_ids=call.reply.response_ids, log_probs=call.reply.log_probs, turn=call.n,
        role=call.agent, node=node, branch=branch, local_reward=reward - team, global_reward=outcome_.team, reward=reward,
        parse_ok=True, chosen=branch == 0 and node != DIVERGED_NODE, temperature=call.reply.temperature, versions=call.reply.versions,
    )


def _end(episode: Episode, finished: Finished) -> None:
    """An episode's end from its last (chosen) run."""
    if finished.fault is not None:
        episode.end_cause, episode.error = finished.fault[0], finished.fault[1]
    if finished.outcome is not None:
        episode.success = finished.outcome.success and finished.fault is None
        episode.final_global_reward = finished.outcome.team


def _times(episode: Episode, runs: Sequence[Finished]) -> None:
    generate = sum(c.generate_s for f in runs for c in f.run.calls)
    episode.generate_s += generate
    episode.env_s += max(sum(f.wall_s for f in runs) - generate, 0.0)  # the programs' own time


async def play_program(config: ProgramConfig, task: dict, agents: Sequence[str], k: int, alpha: float, door: Gateway,
                       render: Render, sample: SampleReply) -> Episode:
    """Play one episode of the program (K = 1: one run; K > 1: the replay tree above)."""
    agents = tuple(agents)
    episode = Episode(program={"runs": 0, "calls": 0, "replayed_calls": 0, "diverged": 0, "resampled_nodes": 0})

    async def runs(prefix: dict, count: int) -> list[Finished]:
        done = await asyncio.gather(*(_run_once(config, task, agents, door, render, sample, prefix) for _ in range(count)))
        episode.program["runs"] += count
        episode.program["calls"] += sum(len(f.run.calls) for f in done)
        episode.program["replayed_calls"] += sum(c.replayed for f in done for c in f.run.calls)
        _times(episode, done)
        return list(done)

    if k == 1:
        (finished,) = await runs({}, 1)
        _end(episode, finished)
        if finished.outcome is not None:
            episode.samples = [_sample(c, "", 0, finished.outcome.reward(c.agent, alpha), finished.outcome, alpha) for c in finished.run.calls]
            episode.turns = len(finished.run.calls)
        return episode

    branches = await runs({}, k)
    path, played, prefix, tries = "", [], {}, 0  # the keys of the nodes so far, in order; their calls; the node's samplings so far
    while True:
        failed = next((f for f in branches if f.outcome is None), None)
        if failed is not None:  # a fault ends the episode where it happened; the nodes before keep their samples
            _end(episode, failed)
            return episode
        # the node: the chosen run's first call (in arrival order) that no earlier node branched; by key,
        # not position, since replayed calls return at once and agents that run together reorder
        at = next((c for c in branches[0].run.calls if (c.agent, c.n) not in played), None)
        if at is None:  # the chosen run made no more calls: the episode is over
            _end(episode, branches[0])
            return episode
        kept: list[tuple[int, Finished, Call]] = []
        for index, finished in enumerate(branches):
            own = finished.run.keyed().get((at.agent, at.n))
            if index == 0 or (not finished.run.diverged and own is not None and not own.replayed and own.prompt_ids == at.prompt_ids):
                kept.append((index, finished, own))
        # the node's K branch calls are one AT-GRPO group: from one weight version, or all K runs again
        # from the node's prefix (an asynchronous trainer pushed between them: branch 0's call came
        # from the run before the push), as an environment's node is sampled again
        tries += 1
        if len({v for _, _, call in kept for v in call.reply.versions}) > 1 and tries < NODE_TRIES:
            again = await runs(prefix, k)
            # branch 0 must be a run that followed the tree so far (replayed every node played): its calls are the path
            faithful = next((i for i, f in enumerate(again) if f.outcome is not None and not f.run.diverged
                             and all(key in f.run.keyed() for key in played)), None)
            if faithful is not None:
                episode.program["resampled_nodes"] += 1
                branches = [again[faithful], *again[:faithful], *again[faithful + 1:]]
                continue
            tries = NODE_TRIES  # none did (a program that does not replay): the node keeps the runs it had
        tries = 0
        at_node = {index for index, _, _ in kept}
        for index, finished in enumerate(branches):
            if index not in at_node:  # not replayable here: its sampled calls train as an independent run's
                episode.program["diverged"] += finished.fault is None  # one stopped at its limit before this call asked nothing else
                episode.samples.extend(
                    _sample(c, DIVERGED_NODE, 0, finished.outcome.reward(c.agent, alpha), finished.outcome, alpha)
                    for c in finished.run.calls if not c.replayed
                )
        rewards = [finished.outcome.reward(at.agent, alpha) for _, finished, _ in kept]
        best = best_branch(rewards)
        for branch, ((_, finished, call), reward) in enumerate(zip(kept, rewards)):
            node_sample = _sample(call, path, branch, reward, finished.outcome, alpha)
            node_sample.chosen = branch == best
            episode.samples.append(node_sample)
        played.append((at.agent, at.n))
        episode.turns = len(played)
        chosen = kept[best][1]
        path = f"{path}.{best}" if path else str(best)
        calls = chosen.run.keyed()
        # the best run was stopped at its limit (every branch was): the episode ends with it, truncated,
        # rather than replay a run that loops, K - 1 times at each of its calls
        if all(key in played for key in calls) or chosen.fault is not None:
            _end(episode, chosen)
            return episode
        prefix = {key: calls[key] for key in played}
        branches = [chosen, *await runs(prefix, k - 1)]
