"""Running a team program for one episode, and reading what it returns.

A program runs in a process of its own (a new session, so its whole process group can be ended):
``python -m pettingllms_verl.programs.runner module:function`` for a function, or the recipe's
command. Its environment carries ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY`` (the run's gateway
session) and ``PETTINGLLMS_TASK_FILE`` (the path of the task as JSON). Its reward is the last line it prints, as
JSON: a number (the team reward), an object of agent name -> reward, or either as
``{"reward": ..., "success": true|false}`` when the program says itself whether the episode was solved.

At most ``program.max_parallel_runs`` runs of a rollout worker are alive at once (``run_slot``, taken
by ``episode.py`` around a run): an evaluation plays every episode of its batch at once, and a
thousand live program processes exhaust a machine's memory.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import sys
import tempfile
import weakref
from dataclasses import dataclass, replace
from typing import Any
from collections.abc import Sequence

from pettingllms_verl.config import ProgramConfig
from pettingllms_verl.programs.contract import run_variables
from pettingllms_verl.programs.forks import ForkServer, ForkServerError

# the directory main_ppo started in (set by the preflight, inherited by Ray's workers): programs
# run there, so a relative program file or command reads as it did on the command line
LAUNCH_DIR = "PETTINGLLMS_LAUNCH_DIR"
OUTPUT_CHARS = 4000  # the tail of a failed program's stderr kept in its error
OUTPUT_GRACE_S = 10.0  # after a run's group is killed, how long its pipes may take to close
OUTPUT_BYTES = 1 << 20  # of each of a run's stdout and stderr, the last this many bytes are kept (a program may print without end)


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
    """A program's (or reward function's) return value as an ``Outcome``; ``ProgramFailed`` says what is wrong.

    Forms: a number (the team reward); an object of agent -> number (each agent's reward); or
    ``{"reward": <either>, "success": <bool>}``, where the program says whether the episode was solved
    instead of ``success_at`` deciding it from the reward (no agent's reward is a bool, so the forms are apart)."""
    if isinstance(value, dict) and set(value) == {"reward", "success"} and not {"reward", "success"} & set(agents):
        if not isinstance(value["success"], bool):
            raise ProgramFailed("program_error", f"the reward's \"success\" must be true or false, got {str(value['success'])[:50]!r}")
        return replace(_rewarded(value["reward"], agents, success_at), success=value["success"])
    return _rewarded(value, agents, success_at)


def _rewarded(value: Any, agents: Sequence[str], success_at: float) -> Outcome:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return Outcome(float(value), None, float(value) >= success_at)
    if isinstance(value, dict) and value and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in value.values()):
        unknown = sorted(set(value) - set(agents))
        if unknown:
            raise ProgramFailed("program_error", f"the reward names {unknown}, no agents of this team ({list(agents)})")
        rewards = {agent: float(value.get(agent, 0.0)) for agent in agents}
        team = sum(rewards.values()) / len(rewards)
        return Outcome(team, rewards, team >= success_at)
    raise ProgramFailed("program_error", f"the reward must be a finite number, an object of agent -> number, or either as "
                        f"{{\"reward\": ..., \"success\": true|false}}, got {str(value)[:200]!r}")


def command(config: ProgramConfig) -> list[str]:
    return list(config.command) if config.command else [sys.executable, "-m", "pettingllms_verl.programs.runner", str(config.target)]


_servers: dict[tuple[str, str | None], ForkServer] = {}
_slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[int, asyncio.Semaphore]] = weakref.WeakKeyDictionary()


def run_slot(limit: int) -> asyncio.Semaphore:
    """The running event loop's ``limit`` slots for program runs (one loop per rollout worker):
    ``async with run_slot(limit):`` around a run."""
    slots = _slots.setdefault(asyncio.get_running_loop(), {})
    if limit not in slots:
        slots[limit] = asyncio.Semaphore(limit)
    return slots[limit]


async def _tail(reader: asyncio.StreamReader) -> bytes:
    """A stream to its end (every writer closed), of which the last ``OUTPUT_BYTES`` are kept."""
    kept = b""
    while chunk := await reader.read(1 << 16):
        kept = (kept + chunk)[-OUTPUT_BYTES:]
    return kept


async def _read(fd: int) -> bytes:
    """A pipe to its end, its last ``OUTPUT_BYTES``."""
    reader = asyncio.StreamReader()
    transport, _ = await asyncio.get_running_loop().connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", 0))
    try:
        return await _tail(reader)
    finally:
        transport.close()


async def _fork(config: ProgramConfig, variables: dict[str, str]) -> tuple[int, Any] | None:
    """A run forked from the program's warm server: (its pid, its output to come), or None where
    the module is not fork-safe."""
    key = (str(config.target), os.environ.get(LAUNCH_DIR))
    server = _servers.setdefault(key, ForkServer(*key))
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    try:
        pid = await asyncio.to_thread(server.spawn, variables, out_w, err_w)
    except BaseException as error:
        for fd in (out_r, err_r):
            os.close(fd)
        if isinstance(error, (ForkServerError, OSError)):
            raise ProgramFailed("program_error", f"the program could not be forked: {error}") from None
        raise
    finally:
        os.close(out_w)
        os.close(err_w)
    if pid is None:
        for fd in (out_r, err_r):
            os.close(fd)
        return None
    return pid, asyncio.gather(_read(out_r), _read(err_r))


def _pidfd(pid: int) -> int | None:
    """A run's process as a pidfd (None: it has already exited and been reaped)."""
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError:
        return None


async def _exited(pidfd: int | None) -> None:
    """Until a run's process has exited (a forked one is the fork server's child, reaped by the kernel)."""
    if pidfd is None:
        return
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    loop.add_reader(pidfd, lambda: done.done() or done.set_result(None))
    try:
        await done
    finally:
        loop.remove_reader(pidfd)


async def run_program(config: ProgramConfig, task: dict, base_url: str, api_key: str) -> Any:
    """Run the program once against ``base_url``; the JSON value of its last printed line. A
    function program is forked from its warm server (``forks.py``), a command (or a module that is
    not fork-safe) is started afresh. Raises ``ProgramFailed``: program_timeout past
    ``time_limit_s``, program_error for a non-zero exit (a forked run that raised prints a last
    line that is no reward) or no JSON last line. When the program exits, or at its time limit,
    its process group is killed: a child it left behind goes with it."""
    with tempfile.NamedTemporaryFile("w", prefix="pettingllms-task-", suffix=".json") as task_file:
        json.dump(task, task_file)  # a file, not the environment: a code problem's tests can outgrow a variable
        task_file.flush()
        variables = run_variables(base_url, api_key, task_file.name)
        forked = await _fork(config, variables) if config.target else None
        process = None
        if forked is not None:
            pid, output = forked
        else:
            process = await asyncio.create_subprocess_exec(
                *command(config), stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                env={**os.environ, **variables, "PYTHONUNBUFFERED": "1"}, start_new_session=True, cwd=os.environ.get(LAUNCH_DIR),
            )
            pid, output = process.pid, asyncio.gather(_tail(process.stdout), _tail(process.stderr))
        reading = asyncio.ensure_future(output)
        pidfd = None
        try:
            try:  # its exit, by pidfd: asyncio's wait() also waits for the pipes, which a left-behind child holds
                pidfd = _pidfd(pid)
                await asyncio.wait_for(_exited(pidfd), config.time_limit_s)
            except TimeoutError:
                raise ProgramFailed("program_timeout",
                                    f"the program ran past pettingllms.program.time_limit_s={config.time_limit_s:g} s and was killed") from None
            finally:
                try:
                    os.killpg(pid, signal.SIGKILL)  # what it left behind in its group
                except ProcessLookupError:
                    pass
                try:
                    out, err = await asyncio.wait_for(reading, OUTPUT_GRACE_S)  # the group is gone: its pipes close
                except TimeoutError:
                    out, err = b"", b"(a process outside the program's group kept its output open)"
                try:  # a killed process closes its pipes before it has done exiting: the episode ends after its run
                    await asyncio.wait_for(_exited(pidfd) if process is None else process.wait(), OUTPUT_GRACE_S)
                except TimeoutError:
                    pass  # SIGKILL is sent; a process the kernel holds longer (uninterruptible sleep) is not ours to wait for
        finally:
            if pidfd is not None:
                os.close(pidfd)
    stderr = err.decode(errors="replace")[-OUTPUT_CHARS:]
    if process is not None and process.returncode != 0:
        raise ProgramFailed("program_error", f"the program exited with status {process.returncode}; its stderr ends:\n{stderr}")
    lines = [line for line in out.decode(errors="replace").splitlines() if line.strip()]
    try:
        return json.loads(lines[-1])
    except (IndexError, ValueError, RecursionError):  # not JSON, or JSON Python will not read (a 5,000-digit number, deep nesting)
        last = lines[-1][:200] if lines else "nothing"
        raise ProgramFailed("program_error", f"the program's last line must be its reward as JSON; it printed {last!r}; its stderr ends:\n{stderr}") from None
