"""``python -m pettingllms_verl.programs.runner module:function``: one run of a team program written
as a Python function (``pettingllms.program.target``), in a process of its own (``call`` is also
what each run forked by ``forks.py`` does).

The function is called as ``fn(task, client)``: ``task`` the problem (the dataset row's env, seed
and task), ``client`` a ``Client`` with the run's ``base_url`` and ``api_key`` (``client.openai()``
gives an ``openai.AsyncOpenAI`` on them). It may be async. What it returns is printed as JSON on
the last line: the run's reward.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import sys
from dataclasses import dataclass

from pettingllms_verl.programs.contract import API_KEY_VARIABLE, BASE_URL_VARIABLE, TASK_VARIABLE
from pettingllms_verl.targets import load_target


@dataclass(frozen=True)
class Client:
    """Where a program's calls go: an OpenAI-compatible base URL and key (one episode's session)."""

    base_url: str
    api_key: str

    def openai(self, **kwargs):
        """An ``openai.AsyncOpenAI`` client on this session (no retries: a failed call is the episode's fault)."""
        from openai import AsyncOpenAI

        return AsyncOpenAI(base_url=self.base_url, api_key=self.api_key, **{"max_retries": 0, **kwargs})


def call(fn) -> None:
    """Call a program function on this process's run (its variables in the environment) and print
    what it returns as JSON, the last line."""
    with open(os.environ[TASK_VARIABLE]) as f:
        task = json.load(f)
    client = Client(os.environ[BASE_URL_VARIABLE], os.environ[API_KEY_VARIABLE])
    result = fn(task, client)
    if inspect.isawaitable(result):
        result = asyncio.run(result)
    print(json.dumps(result), flush=True)


def main(argv: list[str]) -> None:
    if len(argv) != 2:
        sys.exit("usage: python -m pettingllms_verl.programs.runner module:function (PETTINGLLMS_TASK_FILE, OPENAI_BASE_URL and OPENAI_API_KEY set)")
    call(load_target(argv[1]))


if __name__ == "__main__":
    main(sys.argv)
