"""Reliability under random faults: N steps of Plan-Path MAS episodes (K-branch trees) through the
real agent loop (``EpisodeAgentLoop.run``) and the real sandbox, with faults injected at random:
an environment step that raises, a tool program that hangs (until the sandbox's wall limit), a
generation that fails. Prints, per cause, the faults injected, the episodes lost and whether
anything else was lost, and writes JSON.

    .venv/bin/python benchmarks/bench_faults.py [--steps 20] [--episodes 16] [--rate 0.01] [--out benchmarks/results/faults.json]

The model is scripted (every reply is the same program and answer): this measures the fault
accounting of the rollout, not learning. Target: every step completes; the episodes lost to
errors are exactly the episodes that had an error injected (a hung program is a sandbox timeout,
scored, never a loss); every other episode ends normally with all its rows.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import tempfile
import time
from collections import Counter, defaultdict

from omegaconf import OmegaConf
from transformers import AutoTokenizer
from verl.experimental.agent_loop.agent_loop import DictConfigWrap
from verl.workers.rollout.replica import TokenOutput

from pettingllms_verl import envs
from pettingllms_verl.data.rows import task_row
from pettingllms_verl.envs.plan_path.env import PlanPathEnv
from pettingllms_verl.models.tiny import build
from pettingllms_verl.rollout.agent_loop import EpisodeAgentLoop
from pettingllms_verl.episodes.tags import ERRORS
from pettingllms_verl.trainer.metrics import episode_metrics

K = 2
REPLY = "```python\nprint('R D')\n```\n<answer>R D</answer>"
HANG = "while True:\n    pass"
injected: dict[str, Counter] = defaultdict(Counter)  # episode -> cause -> faults injected


class FaultyPlanPath(PlanPathEnv):
    """Plan-Path whose steps raise, and whose tool programs hang, each at ``rate`` per step."""

    options = {**PlanPathEnv.options, "episode": "episode id (for the fault log)", "rate": "fault probability per step"}

    def step(self, role, text):
        rng = random.Random()  # independent of the task's seeded randomness
        if rng.random() < self.config["rate"]:
            injected[self.config["episode"]]["env_error"] += 1
            raise RuntimeError("injected environment fault")
        if role == "tool" and rng.random() < self.config["rate"]:
            injected[self.config["episode"]]["sandbox_hang"] += 1
            text = f"```python\n{HANG}\n```"
        return super().step(role, text)


class FaultyServer:
    """Replies ``REPLY``; a generation fails at ``rate``."""

    def __init__(self, tokenizer, episode: str, rate: float):
        self.reply, self.episode, self.rate = tokenizer.encode(REPLY), episode, rate

    async def generate(self, request_id, prompt_ids, sampling_params, policy=None):
        if random.random() < self.rate:
            injected[self.episode]["engine_error"] += 1
            raise RuntimeError("injected generation fault")
        return TokenOutput(token_ids=self.reply, log_probs=[-0.5] * len(self.reply), extra_fields={"policy": policy, "global_steps": 0})


async def one_step(tokenizer, step: int, episodes: int, rate: float) -> list[list]:
    config = OmegaConf.create({
        "actor_rollout_ref": {"rollout": {"prompt_length": 2048, "response_length": 32}},
        "algorithm": {"adv_estimator": "at_grpo"},
        "pettingllms": {"k": K, "env_kwargs": {"size": 4, "max_turns": 3, "rate": rate, "tool_limits": {"wall_s": 1.0}}},
    })

    async def episode(index: int):
        name = f"{step}/{index}"
        source = envs.make("plan_path", size=4)
        source.reset(seed=index)
        row = task_row("faulty_plan_path", index, source.task, "train", index)
        episode_config = OmegaConf.merge(config, {"pettingllms": {"env_kwargs": {"episode": name}}})
        loop = EpisodeAgentLoop(DictConfigWrap(episode_config), FaultyServer(tokenizer, name, rate), tokenizer, None, None,
                                DictConfigWrap(OmegaConf.create({})))
        return name, await loop.run({"temperature": 1.0}, extra_info=row["extra_info"], uid=name, session_id=index)

    return await asyncio.gather(*(episode(i) for i in range(episodes)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20, help="training steps (batches of episodes) to play")
    parser.add_argument("--episodes", type=int, default=16, help="episodes per step")
    parser.add_argument("--rate", type=float, default=0.01, help="probability of each fault per env step / generation")
    parser.add_argument("--out", default="benchmarks/results/faults.json", help="JSON output path")
    args = parser.parse_args()

    tokenizer = AutoTokenizer.from_pretrained(build(tempfile.mkdtemp(prefix="bench-faults-"), seed=0))
    envs.register_env("faulty_plan_path", f"{__name__}:FaultyPlanPath")
    lost, expected, mixed, steps_done, rows_ok, sandbox = Counter(), Counter(), 0, 0, True, Counter()
    start = time.monotonic()
    for step in range(args.steps):
        results = asyncio.run(one_step(tokenizer, step, args.episodes, args.rate))
        steps_done += 1
        metrics = episode_metrics([o.extra_fields for _, outputs in results for o in outputs])
        sandbox["timeout"] += metrics.get("mas/tool/sandbox/timeout", 0)
        for name, outputs in results:
            end = outputs[-1].extra_fields
            causes = {c for c in injected[name] if c != "sandbox_hang"}
            if end["mas_end_cause"] in ERRORS:
                lost[end["mas_end_cause"]] += 1
            if len(causes) == 1:
                expected[causes.pop()] += 1
            elif causes:
                mixed += 1
            elif end["mas_end_cause"] in ERRORS or any(o.extra_fields["mas_placeholder"] for o in outputs):
                rows_ok = False  # an episode with no fault injected was lost
        print(f"step {step + 1}/{args.steps}: {sum(lost.values())} episodes lost so far", flush=True)
    hangs = sum(c["sandbox_hang"] for c in injected.values())
    report = {
        "steps": args.steps, "steps_completed": steps_done, "episodes": args.steps * args.episodes, "rate": args.rate,
        "lost_by_cause": dict(lost), "injected_episodes_by_cause": dict(expected), "episodes_with_two_causes": mixed,
        "hung_programs_injected": hangs, "sandbox_timeouts_counted": sandbox["timeout"],
        "nothing_else_lost": rows_ok and sum(lost.values()) == sum(expected.values()) + mixed,
        "seconds": round(time.monotonic() - start, 1), "cpus": os.cpu_count(), "loadavg_1m": os.getloadavg()[0],
    }
    print(f"\n{'cause':<14}{'episodes with it injected':>28}{'episodes lost':>16}")
    for cause in sorted(set(lost) | set(expected)):
        print(f"{cause:<14}{expected[cause]:>28}{lost[cause]:>16}")
    print(f"hung tool programs injected: {hangs}; sandbox timeouts counted: {sandbox['timeout']:.0f} (scored, not lost)")
    print(f"steps completed: {steps_done}/{args.steps}; nothing else lost: {report['nothing_else_lost']}; {report['seconds']} s")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
