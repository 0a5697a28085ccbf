"""One multi-agent episode with AT-GRPO tree sampling (no verl, no model: both are injected).

For each turn and each role in the workflow's turn order, the current node is expanded into K
branches: K independent clones of the environment, K replies to the *same* prompt (requested
concurrently, so the engine batches them), each clone stepped with its own reply and scored.
All K samples are emitted, tagged with their group key; the episode continues from the best
clone (greedy argmax of the mixed reward, lowest branch index on ties), chosen only after every
branch of the node has been scored.

With K = 1 this is a plain rollout: ``rollout_mode=independent`` runs K such episodes per
problem (verl's ``rollout.n``) and groups their samples by (problem, turn, role).

Games credit a move with what it allows on another role's reply (a line left open loses on the
opponent's next move, whose step gets the win): with K = 1 the ending step's outcomes are added to
each other role's last reply (``credit_final_rewards``); with K > 1, where the env knows the
game-theoretic value of a position (``Env.position_value``), every branch whose reply leaves the
game going gets that value added to its role reward (``branch_value``).

A fault ends the episode, not the step: a prompt over the budget (truncated), an engine error or
an environment that raises (errors) stop it where it happened; the samples of the nodes already
played are kept and ``Episode.end_cause`` says why it ended. Whether the run goes on is the
trainer's call (``rollout/faults.py``): a dead engine (``EngineDead``) or too many faults stop it.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from collections.abc import Awaitable, Callable, Mapping, Sequence

from pettingllms_verl.envs.base import IGNORED, SANDBOX_RUNS, Env, StepResult
from pettingllms_verl.envs.images import message_images
from pettingllms_verl.envs.text import Messages

# A tree node's K branches are sampled at most this many times to come from one weight version (an
# asynchronous trainer's push lands between two of them only at a step's end; after the last try the
# node keeps what it has): the environments' nodes (rollout/agent_loop.py) and the programs' alike
NODE_TRIES = 4
# (role, prompt ids, n) -> n (token ids, log-probs) replies, sampled independently; a prompt with
# images (PIL, in the order of its image tokens) is also given them, as the keyword images
Generate = Callable[..., Awaitable[list[tuple[list[int], list[float]]]]]
# a role's messages -> prompt ids, and a role's reply ids -> text, each in the role's policy's tokens
Render = Callable[[str, Messages], list[int]]
Decode = Callable[[str, list[int]], str]
# A user's reward for one role's reply (``pettingllms.roles.<role>.reward``), called with keywords
# role, reply (the decoded text), result (the env's StepResult) and env (the branch after the step);
# the K branches of a node call it at once, from K threads: it must be thread-safe
RewardFn = Callable[..., float]
ENV_LOCAL_REWARD = "env_local_reward"  # StepResult.info key: the env's own local reward, where a RewardFn replaced it
POSITION_VALUE = "position_value"  # Sample.info key: the value a tree added to the reply's role reward (branch_value)


@dataclass
class Sample:
    """One reply of one role at one tree node: a training sample with its own reward."""

    prompt_ids: list[int]
    response_ids: list[int]
    log_probs: list[float]
    turn: int
    role: str
    node: str  # path of chosen branches from the root ("" at the root): identifies the state
    branch: int
    local_reward: float  # the role's reward for the reply, plus its branch_value in a tree
    global_reward: float
    reward: float  # alpha * global + local
    parse_ok: bool
    chosen: bool = False
    placeholder: bool = False  # stands for an episode that ended before its first reply: never trained on
    sandbox_runs: dict[str, int] = field(default_factory=dict)  # the sandbox runs this reply caused, by status
    info: dict = field(default_factory=dict)  # the env's StepResult.info: the parsed action, what it did
    snapshot: dict | None = None  # the branch's state after this reply (Env.snapshot), when the episode records them
    temperature: float | None = None  # set: the reply was sampled at this temperature (a program's request), not its role's
    images: list | None = None  # the prompt's images (PIL), in the order of its image tokens; None: a text prompt
    versions: frozenset[int] = frozenset()  # a program's call: the weight versions its reply came from (an environment's: by role, in the loop)


class PromptTooLong(ValueError):
    """Raised by ``render``: the prompt exceeds the rollout's budget (the episode ends truncated)."""


class EngineDead(RuntimeError):
    """Raised by ``generate``: the server behind the request is gone for good, not failing one
    request. The episode ends ``engine_dead``; every later request would fail the same way, so the
    trainer stops the run on it (``rollout/faults.py``)."""


class _Ended(Exception):
    def __init__(self, cause: str, error: BaseException):
        super().__init__(cause)
        self.cause, self.error = cause, error


@dataclass
class Episode:
    samples: list[Sample] = field(default_factory=list)
    success: bool = False
    end_cause: str | None = None  # None (the env finished), or one of episodes.tags' TRUNCATIONS / ERRORS
    error: BaseException | None = None  # what ended it, for an ERRORS, prompt_overflow or program_limit end
    turns: int = 0
    final_global_reward: float = 0.0
    generate_s: float = 0.0  # wall time spent waiting for the engine
    env_s: float = 0.0  # wall time spent rendering prompts, stepping and cloning envs
    start: dict | None = None  # the state before the first reply (Env.snapshot), when the episode records them
    program: dict | None = None  # a team program's episode (programs/episode.py): its runs, replayed calls, diverged replays


def episode_return(samples: Sequence[Sample], final_global_reward: float, alpha: float) -> float:
    """The return of one episode for trajectory-level estimators (verl's GRPO: the SA baseline).

    ``alpha * final team reward + mean role reward over the chosen replies``. The team reward is a
    level of the state (progress, success), so it is counted once, at the end; role rewards are
    averaged, not summed, so a stalled reply lowers the return instead of adding to it
    (``tests/episodes/test_episode_return.py``: in every environment, a solution played fast scores at least
    as much as the same solution with stalls in between). Placeholder rows (no reply) do not count.
    """
    played = [s.local_reward for s in samples if s.chosen and not s.placeholder]
    return alpha * final_global_reward + (sum(played) / len(played) if played else 0.0)


def best_branch(rewards: Sequence[float]) -> int:
    """Greedy choice of AT-GRPO: argmax, ties to the lowest index (deterministic)."""
    return max(range(len(rewards)), key=lambda i: (rewards[i], -i))


def _step(env: Env, role: str, text: str, reward: RewardFn | None) -> StepResult:
    result = env.step(role, text)
    if reward is None or IGNORED in result.info:  # a reply the env ignored (episode over) earns nothing
        return result
    local = float(reward(role=role, reply=text, result=result, env=env))
    return StepResult(local, result.parse_ok, {**result.info, ENV_LOCAL_REWARD: result.local_reward})


async def _step_all(clones: list[Env], role: str, texts: list[str], reward: RewardFn | None) -> list[StepResult]:
    # Steps may run sandboxed tool code (blocking, up to its wall limit): off the event loop,
    # concurrently, so one slow branch does not serialise the others or stall other episodes.
    return await asyncio.gather(*(asyncio.to_thread(_step, clone, role, text, reward) for clone, text in zip(clones, texts)))


async def run_episode(
    env: Env,
    turn_order: Sequence[str],
    max_turns: int,
    k: int,
    alpha: float,
    generate: Generate,
    render: Render,
    decode: Decode,
    snapshots: bool = False,
    rewards: Mapping[str, RewardFn] | None = None,
) -> Episode:
    """Play ``env`` (already reset) to the end, or to a fault; returns every played branch's sample
    (with ``snapshots``, each with its branch's state after the reply: for logs, off in training).
    ``rewards``: role -> a function whose value replaces the env's local reward of that role's
    replies (a function that raises ends the episode as an ``env_error``)."""
    episode = Episode(start=env.snapshot() if snapshots else None)
    try:
        env = await _play(episode, env, turn_order, max_turns, k, alpha, generate, render, decode, snapshots, rewards or {})
    except _Ended as ended:
        episode.end_cause, episode.error = ended.cause, ended.error
        return episode
    # out of turns: the loop's budget ran out (the env goes on), or the env ended on its own turn
    # limit; an end by the env's rules (a win, a loss, a draw) is no truncation, whatever the turn
    episode.end_cause = "max_turns" if not env.done or env.truncated else None
    episode.success = bool(env.success)
    episode.final_global_reward = float(env.global_reward)
    if k == 1:
        credit_final_rewards(episode.samples)
    return episode


def credit_final_rewards(samples: Sequence[Sample]) -> None:
    """A game that ends on one role's reply reports every role's outcome (``info["final_rewards"]``,
    e.g. Tic-Tac-Toe's loss or draw); it lands on that reply only, so each other role's last chosen
    reply, the move that let the game end so, gets its own outcome added to its role and mixed reward.

    Only for plain episodes (K = 1, ``rollout_mode=independent``): in a tree, the other K - 1
    branches of that node were never played on, so crediting the chosen one alone would rank it
    below its siblings for an outcome they might have met too; crediting all K would shift the group
    by a constant, which GRPO's normalisation removes. A tree credits each branch with the value of
    the position its own reply left instead (``branch_value``)."""
    chosen = [s for s in samples if s.chosen and not s.placeholder]
    final = chosen[-1].info.get("final_rewards") if chosen else None
    for role, outcome in (final or {}).items():
        last = next((s for s in reversed(chosen) if s.role == role), None)
        if last is not None and last is not chosen[-1]:  # the ending reply has its own outcome already
            last.local_reward += float(outcome)
            last.reward += float(outcome)


def branch_value(env: Env, role: str, result: StepResult) -> float | None:
    """What a K-branch tree adds to a branch's role reward: ``env.position_value(role)`` (``env``: the
    branch after the reply), ``role``'s outcome reward under perfect play from there.

    Scaled as the env's outcome rewards, with no factor: a reply that leaves the game going is
    credited with the outcome it leads to, one that ends it with the outcome it reached (the env's
    own reward, so None here: never counted twice). Within a node an immediate win, a move that
    keeps a drawn game and a move that allows a loss on the opponent's reply thus rank as their
    outcomes do, and the greedy continuation follows the same order. None also for a reply the env
    ignored (it earns nothing) and for an env without values (its rewards are unchanged)."""
    if env.done or IGNORED in result.info:
        return None
    return env.position_value(role)


async def _play(episode: Episode, env: Env, turn_order, max_turns, k, alpha, generate, render, decode, snapshots, rewards) -> Env:
    """The turns of ``run_episode``; returns the final state, raises ``_Ended`` on a fault."""
    path = ""
    for turn in range(max_turns):
        for role in turn_order:
            started = time.perf_counter()
            try:
                messages = env.observation(role)
            except Exception as error:
                raise _Ended("env_error", error) from error
            images = message_images(messages) or None  # a role shown the state as an image (envs/images.py)
            try:
                prompt_ids = render(role, messages)
            except PromptTooLong as error:
                raise _Ended("prompt_overflow", error) from error
            except Exception as error:  # the chat template or processor refuses these messages: this episode's fault
                raise _Ended("env_error", error) from error
            episode.env_s += time.perf_counter() - started

            started = time.perf_counter()
            try:
                replies = await (generate(role, prompt_ids, k, images=images) if images else generate(role, prompt_ids, k))
            except EngineDead as error:
                raise _Ended("engine_dead", error) from error
            except Exception as error:
                raise _Ended("engine_error", error) from error
            episode.generate_s += time.perf_counter() - started

            started = time.perf_counter()
            try:
                clones = [env.clone() for _ in range(k)]
                results = await _step_all(clones, role, [decode(role, ids) for ids, _ in replies], rewards.get(role))
                # a plain episode credits the outcome it met instead (credit_final_rewards)
                values = [branch_value(clone, role, result) for clone, result in zip(clones, results)] if k > 1 else [None] * k
            except Exception as error:
                raise _Ended("env_error", error) from error
            node_samples = []
            for branch, ((ids, log_probs), clone, result, value) in enumerate(zip(replies, clones, results, values)):
                global_reward = float(clone.global_reward)
                local_reward = float(result.local_reward) + (value or 0.0)
                node_samples.append(
                    Sample(
                        prompt_ids=prompt_ids,
                        response_ids=list(ids),
                        log_probs=list(log_probs),
                        turn=turn,
                        role=role,
                        node=path,
                        branch=branch,
                        local_reward=local_reward,
                        global_reward=global_reward,
                        reward=alpha * global_reward + local_reward,
                        parse_ok=bool(result.parse_ok),
                        sandbox_runs=dict(result.info.get(SANDBOX_RUNS, {})),
                        info=result.info if value is None else {**result.info, POSITION_VALUE: value},
                        snapshot=clone.snapshot() if snapshots else None,
                        images=images,
                    )
                )
            best = best_branch([s.reward for s in node_samples])
            node_samples[best].chosen = True
            episode.samples.extend(node_samples)
            env = clones[best]
            path = f"{path}.{best}" if path else str(best)
            episode.env_s += time.perf_counter() - started
            if env.done:
                break
        episode.turns = turn + 1
        if env.done:
            break
    return env
