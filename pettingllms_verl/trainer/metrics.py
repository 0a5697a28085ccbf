"""The trainer's metrics, from the rows' tags (``episodes/tags.py``): pure functions over one step.

``mas/`` (episodes: success, turns, faults, programs, per role), ``policy/<name>/`` (each policy's
rows, staleness and verl's metrics of its pass) and verl's plain names as the mean over the
trainable policies.
"""

from __future__ import annotations

from collections import Counter, defaultdict

import numpy as np
import torch

from pettingllms_verl.episodes.tags import ERRORS, TRUNCATIONS
from pettingllms_verl.rollout.faults import FaultTally


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
        metrics["mas/turns_max"] = float(max(t["mas_turns"] for t in ends))  # the longest episode: what a synchronous step waits for
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


def lag(tag: dict, global_steps: int) -> int | None:
    """How many weight pushes behind its policy's newest a row's oldest reply was sampled (0: the
    weights step ``global_steps`` trains; > 0 only in an asynchronous mode); None: a row without a
    reply (a placeholder, a padding row). ``tag``: the row's tags (``mas_weight_versions``)."""
    versions = tag.get("mas_weight_versions")
    return global_steps - 1 - min(versions) if versions else None


def staleness(tags: list[dict], global_steps: int) -> dict[str, float]:
    """``lag`` over a trainable policy's rows that hold a reply: its mean and max.

    Args:
        tags: (rows,) one policy's rows' tags (``mas_weight_versions``: the versions of its replies).
    """
    lags = [value for tag in tags if (value := lag(tag, global_steps)) is not None]
    if not lags:
        return {}
    return {"off_policy/staleness_mean": float(np.mean(lags)), "off_policy/staleness_max": float(max(lags))}


def policy_metrics(per_policy: dict[str, dict[str, float]], trainable: set[str]) -> dict[str, float]:
    """``policy/<name>/...`` for every policy; verl's plain names (``actor/grad_norm``, ...) are the
    mean over the trainable policies (over all when every policy is frozen); row counts (``rows``,
    ``off_policy/untrained_rows``) stay per policy."""
    averaged = [name for name in per_policy if name in trainable] or list(per_policy)
    metrics: dict[str, float] = {}
    plain: dict[str, list[float]] = defaultdict(list)
    for name, values in per_policy.items():
        for key, value in values.items():
            metrics[f"policy/{name}/{key}"] = value
            if key not in ("rows", "off_policy/untrained_rows") and name in averaged:
                plain[key].append(value)
    metrics.update({key: float(np.mean(values)) for key, values in plain.items()})
    return metrics
