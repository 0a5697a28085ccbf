"""Team programs for ``tests/programs/test_programs.py``: each runs in a process of its own through
``pettingllms_verl.programs.runner`` and talks to the gateway with the plain ``openai`` client."""

import asyncio
import os
import random
import subprocess
import sys
import time


async def writer_and_checker(task, client):
    """Two agents, two calls each; the checker reads the writer's reply. Rewards per agent depend
    only on the replies (replayable: the same replies give the same calls)."""
    ai = client.openai()
    draft = ""
    for round_ in range(2):
        reply = await ai.chat.completions.create(model="writer", messages=[
            {"role": "system", "content": "write"}, {"role": "user", "content": f"seed {task['seed']} round {round_} after {draft!r}"}])
        draft = reply.choices[0].message.content
        await ai.chat.completions.create(model="checker", messages=[{"role": "user", "content": f"check {draft!r}"}])
    return {"writer": float(draft.count("1")), "checker": 1.0}


def team_number(task, client):
    """A sync program returning the team reward: 1 when the writer's one reply holds a '1'."""
    from openai import OpenAI

    ai = OpenAI(base_url=client.base_url, api_key=client.api_key, max_retries=0)
    reply = ai.chat.completions.create(model="writer", messages=[{"role": "user", "content": "go"}], temperature=0.5, max_tokens=3)
    return 1.0 if "1" in reply.choices[0].message.content else 0.0


async def unreplayable(task, client):
    """Asks with a random number in its prompt: a replay never asks what it asked before."""
    ai = client.openai()
    for _ in range(2):
        await ai.chat.completions.create(model="writer", messages=[{"role": "user", "content": f"noise {random.random()}"}])
    return 0.5


def raises(task, client):
    raise RuntimeError("the program broke")


def no_call(task, client):
    return 1.0


async def too_many_calls(task, client):
    ai = client.openai()
    for _ in range(50):
        await ai.chat.completions.create(model="writer", messages=[{"role": "user", "content": "again"}])
    return 1.0


async def loops_on_zero(task, client):
    """The writer's one reply decides: a '0' sends the checker round forever (into the call limit),
    anything else ends after one check with the team reward 1."""
    ai = client.openai()
    reply = await ai.chat.completions.create(model="writer", messages=[{"role": "user", "content": "go"}])
    while True:
        await ai.chat.completions.create(model="checker", messages=[{"role": "user", "content": f"check {reply.choices[0].message.content}"}])
        if "0" not in reply.choices[0].message.content:
            return 1.0


def calls_then_hangs(task, client):
    """One call, then hangs past any time limit."""
    from openai import OpenAI

    OpenAI(base_url=client.base_url, api_key=client.api_key, max_retries=0).chat.completions.create(
        model="writer", messages=[{"role": "user", "content": "go"}])
    time.sleep(600)


def hangs(task, client):
    """Starts a child that would outlive it, writes both pids, then hangs."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    with open(task["task"]["pid_file"], "w") as f:
        f.write(f"{os.getpid()} {child.pid}")
    time.sleep(600)


def bad_reward(task, client):
    asyncio.run(client.openai().chat.completions.create(model="writer", messages=[{"role": "user", "content": "x"}]))
    return "lots"


def parent_pid(task, client):
    """Writes the pid of its parent process, then makes one call."""
    with open(task["task"]["out"], "w") as f:
        f.write(str(os.getppid()))
    asyncio.run(client.openai().chat.completions.create(model="writer", messages=[{"role": "user", "content": "x"}]))
    return 1.0


def chatty(task, client):
    """Prints 8 MB before its one call and its reward."""
    for _ in range(8):
        print("x" * (1 << 20))
    asyncio.run(client.openai().chat.completions.create(model="writer", messages=[{"role": "user", "content": "x"}]))
    return 0.5


def prints_then_raises(task, client):
    asyncio.run(client.openai().chat.completions.create(model="writer", messages=[{"role": "user", "content": "x"}]))
    print(1.0)
    raise RuntimeError("after its reward")


async def leaves_a_child(task, client):
    """Starts a child that keeps its output open, then returns at once."""
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    await client.openai().chat.completions.create(model="writer", messages=[{"role": "user", "content": "x"}])
    return 0.25


async def concurrent_agents(task, client):
    """Writer and checker at once, twice each (replayable: each agent's calls in order)."""
    ai = client.openai()

    async def agent(name):
        text = ""
        for i in range(2):
            reply = await ai.chat.completions.create(model=name, messages=[{"role": "user", "content": f"{name} {i} {text}"}])
            text = reply.choices[0].message.content
        return text

    writer, checker = await asyncio.gather(agent("writer"), agent("checker"))
    return {"writer": float(writer.count("1")), "checker": float(checker.count("2"))}


async def alive_together(task, client):
    """One call, then counts the runs alive beside it (a marker file per run in the task's ``dir``)
    and appends the count to ``dir/counts``."""
    folder = task["task"]["dir"]
    marker = os.path.join(folder, f"alive-{os.getpid()}")
    open(marker, "w").close()
    await client.openai().chat.completions.create(model="writer", messages=[{"role": "user", "content": "x"}])
    await asyncio.sleep(0.5)
    alive = sum(name.startswith("alive-") for name in os.listdir(folder))
    with open(os.path.join(folder, "counts"), "a") as f:
        f.write(f"{alive}\n")
    os.remove(marker)
    return 1.0
