"""Running a team program for one episode, and reading what it returns.

A program runs in a process of its own (a new session, so its whole process group can be ended):
``python -m pettingllms_verl.programs.runner module:function`` for a function, or the recipe's
command. Its environment carries ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY`` (the run's gateway
session) and ``PETTINGLLMS_TASK`` (the task as JSON). Its reward is the last line it prints, as
JSON: a number (the team reward) or an object of agent name -> reward.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import sys
from dataclasses import dataclass
from typing import Any, Sequence

from pettingllms_verl.config import ProgramConfig

TASK_VARIABLE = "PETTINGLLMS_TASK"
# the directory main_ppo started in (set by the preflight, inherited by Ray's workers): programs
# run there, so a relative program file or command reads as it did on the command line
LAUNCH_DIR = "PETTINGLLMS_LAUNCH_DIR"
OUTPUT_CHARS = 4000  # the tail of a failed program's stderr kept in its error


class ProgramFailed(Exception):
    """A run that yields no reward; ``cause`` is one of ``episode.ERRORS``' program causes."""

    def __init__(self, cause: str, message: str):
        super().__init__(message)
        self.cause = cause


@dataclass(frozen=True)
class Outcome:
    """What a run earned: the team reward, each agent's own reward (``None``: the program gave the
    team's alone), and whether the episode counts as solved."""

    team: float
    agents: dict[str, float] | None
    success: bool

    def reward(self, agent: str, alpha: float) -> float:
        """A call's training reward: the agent's own reward where the program gave them, else alpha * team."""
        return self.agents[agent] if self.agents is not None else alpha * self.team


def outcome(value: Any, agents: Sequence[str], success_at: float) -> Outcome:
    """A program's (or reward function's) return value as an ``Outcome``; ``ProgramFailed`` says what is wrong."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return Outcome(float(value), None, float(value) >= success_at)
    if isinstance(value, dict) and value and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in value.values()):
        unknown = sorted(set(value) - set(agents))
        if unknown:
            raise ProgramFailed("program_error", f"the reward names {unknown}, no agents of this team ({list(agents)})")
        rewards = {agent: float(value.get(agent, 0.0)) for agent in agents}
        team = sum(rewards.values()) / len(rewards)
        return Outcome(team, rewards, team >= success_at)
    raise ProgramFailed("program_error", f"the reward must be a finite number or an object of agent -> number, got {str(value)[:200]!r}")


def command(config: ProgramConfig) -> list[str]:
    return list(config.command) if config.command else [sys.executable, "-m", "pettingllms_verl.programs.runner", str(config.target)]


async def run_program(config: ProgramConfig, task: dict, base_url: str, api_key: str) -> Any:
    """Run the program once against ``base_url``; the JSON value of its last printed line.
    Raises ``ProgramFailed``: program_timeout past ``time_limit_s``, program_error for a non-zero
    exit or no JSON last line. Its processes are ended in every case, a left-behind child included."""
    env = {**os.environ, "OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": api_key, TASK_VARIABLE: json.dumps(task), "PYTHONUNBUFFERED": "1"}
    process = await asyncio.create_subprocess_exec(
        *command(config), stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env=env, start_new_session=True, cwd=os.environ.get(LAUNCH_DIR),
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), config.time_limit_s)
    except asyncio.TimeoutError:
        raise ProgramFailed("program_timeout", f"the program ran past pettingllms.program.time_limit_s={config.time_limit_s:g} s and was killed") from None
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        await process.wait()
    stderr = err.decode(errors="replace")[-OUTPUT_CHARS:]
    if process.returncode != 0:
        raise ProgramFailed("program_error", f"the program exited with status {process.returncode}; its stderr ends:\n{stderr}")
    lines = [line for line in out.decode(errors="replace").splitlines() if line.strip()]
    try:
        return json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        last = lines[-1][:200] if lines else "nothing"
        raise ProgramFailed("program_error", f"the program's last line must be its reward as JSON; it printed {last!r}") from None
