"""A team program for the tests: each Plan-Path problem is played by one of the four example
programs (``examples/agents/``: the bare ``openai`` client, LangGraph, the OpenAI Agents SDK, and
AutoGen AgentChat), chosen by the problem's seed, so one ``main_ppo`` launch per policy level trains
every framework's calls.

Each example's ``team`` is called unchanged. The AutoGen one runs the way a recipe runs a command:
a process in its own environment (``make install-autogen``; AutoGen pins protobuf 5, verl's stack
needs 6) that inherits this run's ``OPENAI_BASE_URL``, ``OPENAI_API_KEY`` and
``PETTINGLLMS_TASK_FILE``, its reward the last line it prints.
"""

import asyncio
import json
import os

from pettingllms_verl.targets import load_target

FRAMEWORKS = ("plan_path_openai", "plan_path_langgraph", "plan_path_agents_sdk", "plan_path_autogen")
# main_ppo's processes load this file by its path, where tests/ is not importable: the repository from here
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES = os.path.join(ROOT, "examples", "agents")
AUTOGEN_PYTHON = os.path.join(ROOT, ".venv-autogen", "bin", "python")  # make install-autogen
TEAMS = {name: load_target(f"{EXAMPLES}/{name}.py:team") for name in FRAMEWORKS if name != "plan_path_autogen"}


def framework(seed: int) -> str:
    """The example that plays the problem of this seed."""
    return FRAMEWORKS[seed % len(FRAMEWORKS)]


async def team(task: dict, client):
    name = framework(task["seed"])
    if name in TEAMS:
        return await TEAMS[name](task, client)
    process = await asyncio.create_subprocess_exec(AUTOGEN_PYTHON, f"{EXAMPLES}/{name}.py", stdout=asyncio.subprocess.PIPE)
    out, _ = await process.communicate()
    if process.returncode != 0:
        raise RuntimeError(f"the AutoGen team exited with {process.returncode}")
    return json.loads(out.decode().strip().splitlines()[-1])
