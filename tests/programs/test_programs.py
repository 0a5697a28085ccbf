"""Team programs through the gateway, in-process: the HTTP door and its checks, a program's calls as
samples, faults counted by cause, and AT-GRPO tree sampling by replay. Programs run for real (in
processes of their own, with the ``openai`` client, ``team_programs.py``); the model is a stand-in
whose replies are drawn from a seeded generator."""

import asyncio
import json
import os
import random
import sys
import threading
import time
from dataclasses import replace

import aiohttp
import pytest

from pettingllms_verl.programs.episode import DIVERGED_NODE, Reply, Run, play_program
from pettingllms_verl.programs.gateway import Gateway, GatewayError, parse_request
from pettingllms_verl.programs.program import Outcome, ProgramFailed, outcome, run_slot
from pettingllms_verl.config import ProgramConfig, SettingsError, load
from pettingllms_verl.episodes.core import PromptTooLong
from pettingllms_verl.episodes.tags import ERRORS, TRUNCATIONS
from support import SUPPORT
from support.plan_path_frameworks import AUTOGEN_PYTHON, EXAMPLES  # the example programs' folder, the AutoGen team's Python

PROGRAMS = str(SUPPORT / "team_programs.py")
AGENTS = ("writer", "checker")


def program(name: str, **kwargs) -> ProgramConfig:
    return ProgramConfig(target=f"{PROGRAMS}:{name}", **kwargs)


def render(agent, messages, tools=None) -> list[int]:
    """Prompt ids: the characters of the messages (equal messages, equal ids)."""
    ids = [ord(c) % 997 for c in json.dumps([messages, tools], sort_keys=True)]
    if len(ids) > 2000:
        raise PromptTooLong(f"{len(ids)} tokens")
    return ids


class Model:
    """A stand-in policy: replies of one to three digits from a seeded generator; counts calls."""

    def __init__(self, seed: int = 0):
        self.rng = random.Random(seed)
        self.calls = 0

    async def __call__(self, request, n, prompt_ids) -> Reply:
        self.calls += 1
        text = "".join(self.rng.choice("0123") for _ in range(self.rng.randint(1, 3)))
        ids = [ord(c) for c in text]
        return Reply(ids, [-0.5] * len(ids), {"role": "assistant", "content": text}, "stop", request.sampling.get("temperature"))


def play(config: ProgramConfig, k: int = 1, model=None, seed: int = 7, alpha: float = 1.0, task=None):
    async def main():
        door = Gateway()
        await door.start()
        try:
            return await play_program(config, {"env": "t", "seed": seed, "task": task or {}}, AGENTS, k, alpha, door, render, model or Model())
        finally:
            await door.stop()

    return asyncio.run(main())


# --- the request checks -------------------------------------------------------------------------

def test_a_request_names_an_agent_and_carries_its_sampling_values():
    request = parse_request({
        "model": "writer", "temperature": 0.3, "top_p": 0.9, "max_completion_tokens": 12, "stop": "END", "seed": 5, "tool_choice": "auto",
        "messages": [{"role": "developer", "content": [{"type": "text", "text": "be brief"}]},
                     {"role": "assistant", "content": None,
                      "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}}]},
                     {"role": "tool", "tool_call_id": "c1", "content": "2"}],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
    }, AGENTS)
    assert request.agent == "writer" and request.sampling == {"temperature": 0.3, "top_p": 0.9, "max_tokens": 12, "stop": ["END"]}
    assert request.messages[0] == {"role": "system", "content": "be brief"}
    assert request.messages[1]["tool_calls"][0]["function"] == {"name": "f", "arguments": {"x": 1}}  # as chat templates read it
    assert request.messages[2] == {"role": "tool", "content": "2", "tool_call_id": "c1"}


def test_a_call_renders_off_the_event_loop_so_a_long_prompt_holds_up_nothing_else():
    """A call's render waits for the event loop to run something else meanwhile. On the event loop it
    would hold it, and nothing else could run (its wait gives up after a minute and fails)."""
    loop_ran = threading.Event()

    def slow_render(agent, messages, tools=None):
        assert loop_ran.wait(60), "the event loop ran nothing while a call was rendered"
        return render(agent, messages, tools)

    async def call():
        run = Run(AGENTS, max_calls=4, render=slow_render, sample=Model())
        asyncio.get_running_loop().call_soon(loop_ran.set)
        return await run(parse_request({"model": "writer", "messages": [{"role": "user", "content": "go"}]}, AGENTS))

    assert asyncio.run(call())["choices"][0]["message"]["role"] == "assistant"


@pytest.mark.parametrize("body, status, words", [
    ({"model": "boss", "messages": [{"role": "user", "content": "x"}]}, 404, "['writer', 'checker']"),
    ({"model": "writer", "messages": []}, 400, "messages"),
    ({"model": "writer", "messages": [{"role": "robot", "content": "x"}]}, 400, "role"),
    ({"model": "writer", "messages": [{"role": [], "content": "x"}]}, 400, "role"),  # unhashable: a 400, not a TypeError's 500
    ({"model": "writer", "messages": [{"role": {"user": 1}, "content": "x"}]}, 400, "role"),
    ({"model": ["w"] * 100_000, "messages": [{"role": "user", "content": "x"}]}, 404, "['w', 'w'"),  # named, not echoed whole
    ({"model": "writer", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, 400, "text content"),
    ({"model": "writer", "messages": [{"role": "user", "content": "x"}], "stream": True}, 400, "streaming"),
    ({"model": "writer", "messages": [{"role": "user", "content": "x"}], "n": 3}, 400, "one choice"),
    ({"model": "writer", "messages": [{"role": "user", "content": "x"}], "temperature": "hot"}, 400, "temperature"),
    ({"model": "writer", "messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, 400, "max_tokens"),
    ({"model": "writer", "messages": [{"role": "user", "content": "x"}], "top_p": 0}, 400, "top_p: 0; must be in (0, 1]"),
    ({"model": "writer", "messages": [{"role": "user", "content": "x"}], "stop": list("abcde")}, 400, "at most 4"),
    ({"model": "writer", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "retrieval"}]}, 400, "tools[0]"),
    (["not", "an", "object"], 400, "JSON object"),
])
def test_a_bad_request_is_refused_with_the_reason(body, status, words):
    with pytest.raises(GatewayError) as error:
        parse_request(body, AGENTS)
    assert error.value.status == status and words in error.value.message and len(error.value.message) < 300


def test_a_temperature_too_small_to_score_is_greedy():
    """1e-300 is 0 in float32: a row scored at it would divide its logits into inf. Below 1e-5 a
    request samples greedily (as vLLM does) and its rows are scored at 1, as greedy replies are."""
    ask = {"model": "writer", "messages": [{"role": "user", "content": "x"}]}
    assert parse_request({**ask, "temperature": 1e-300}, AGENTS).sampling == {"temperature": 0.0}
    assert parse_request({**ask, "temperature": 2e-5}, AGENTS).sampling == {"temperature": 2e-5}


def test_the_reward_forms_and_what_is_refused():
    assert outcome(0.5, AGENTS, 1.0) == Outcome(0.5, None, False)
    assert outcome({"writer": 1.0}, AGENTS, 0.5) == Outcome(0.5, {"writer": 1.0, "checker": 0.0}, True)
    assert outcome(2.0, AGENTS, 1.0).reward("checker", alpha=0.5) == 1.0
    # the program's own word on success, whatever the threshold would say of its reward
    assert outcome({"reward": {"writer": 1.5, "checker": 0.9}, "success": False}, AGENTS, 1.0) == Outcome(1.2, {"writer": 1.5, "checker": 0.9}, False)
    assert outcome({"reward": 0.2, "success": True}, AGENTS, 1.0) == Outcome(0.2, None, True)
    with pytest.raises(ProgramFailed, match=r'"success" must be true or false, got .1.'):
        outcome({"reward": 1.0, "success": 1}, AGENTS, 1.0)
    for bad, words in ((True, "finite number"), (float("nan"), "finite number"), ({"boss": 1.0}, "['boss']"), ("1", "finite number"),
                       ({"reward": {"boss": 1.0}, "success": True}, "['boss']"),
                       ({"reward": "1", "success": True}, "finite number")):
        with pytest.raises(ProgramFailed, match=words.replace("[", r"\[").replace("]", r"\]")):
            outcome(bad, AGENTS, 1.0)


def test_a_program_config_is_checked_before_anything_runs():
    with pytest.raises(SettingsError, match="pettingllms.roles: a program's agents"):
        load({"program": {"target": "x:y"}})
    with pytest.raises(SettingsError, match="pettingllms.program.command: .*not both"):
        load({"program": {"target": "x:y", "command": ["prog"]}, "roles": {"a": {}}})
    assert load({"program": {"command": ["prog"]}, "roles": {"a": {}}}).program.enabled
    with pytest.raises(SettingsError, match="pettingllms.program.max_parallel_runs: 0; must be positive"):
        load({"program": {"target": "x:y", "max_parallel_runs": 0}, "roles": {"a": {}}})
    with pytest.raises(SettingsError, match="pettingllms.program.limit_reward: nan; a finite reward"):
        load({"program": {"target": "x:y", "limit_reward": float("nan")}, "roles": {"a": {}}})


def test_no_more_runs_are_alive_at_once_than_the_slots_allow(tmp_path):
    """Six episodes played at once (as an evaluation plays its batch) with max_parallel_runs=2: the
    others wait for a slot, so no run ever sees more than two alive, and every episode is played."""
    config = program("alive_together", max_parallel_runs=2)

    async def main():
        door = Gateway()
        await door.start()
        try:
            return await asyncio.gather(*(play_program(config, {"env": "t", "seed": seed, "task": {"dir": str(tmp_path)}}, AGENTS, 1, 1.0,
                                                       door, render, Model()) for seed in range(6)))
        finally:
            await door.stop()

    episodes = asyncio.run(main())
    assert all(episode.success for episode in episodes), [(episode.end_cause, episode.error) for episode in episodes]
    counts = [int(line) for line in (tmp_path / "counts").read_text().split()]
    assert len(counts) == 6 and max(counts) <= 2, counts


def test_a_run_waits_for_a_slot_and_its_time_limit_starts_when_it_gets_one(tmp_path):
    """The only slot held for 16 s, longer than the run's 15 s limit (a run's own time on a loaded
    machine stays well inside it): the run waits, then plays whole."""
    config = program("alive_together", max_parallel_runs=1, time_limit_s=15)

    async def main():
        door = Gateway()
        await door.start()
        try:
            async with run_slot(1):
                episode = asyncio.ensure_future(play_program(config, {"env": "t", "seed": 0, "task": {"dir": str(tmp_path)}}, AGENTS, 1, 1.0,
                                                             door, render, Model()))
                await asyncio.sleep(16)
                assert not (tmp_path / "counts").exists()  # not started while the slot was held
            return await episode
        finally:
            await door.stop()

    episode = asyncio.run(main())
    assert episode.success and episode.end_cause is None, (episode.end_cause, episode.error)


# --- the HTTP door ------------------------------------------------------------------------------

def test_the_gateway_answers_its_session_only_and_forgets_it_when_closed():
    async def main():
        door = Gateway(max_request_bytes=8192)
        await door.start()
        seen = []

        async def handler(request):
            seen.append(request.agent)
            return {"ok": request.agent}

        base, token = door.open(AGENTS, handler)
        other_base, other = door.open(AGENTS, handler)
        assert token != other and len(token) >= 32 and base.startswith("http://127.0.0.1:")
        body = {"model": "checker", "messages": [{"role": "user", "content": "x"}]}
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{base}/models") as r:
                assert [m["id"] for m in (await r.json())["data"]] == list(AGENTS)
            async with http.post(f"{base}/chat/completions", json=body) as r:
                assert r.status == 200 and await r.json() == {"ok": "checker"}
            async with http.post(f"{base}/chat/completions", data=b"{not json") as r:
                assert r.status == 400 and "not JSON" in (await r.json())["error"]["message"]
            for unreadable, headers in ((b"[" * 3000 + b"]" * 3000, {}), (b'{"model": ' + b"9" * 5000 + b"}", {}),  # too deep; a number Python will not read
                                        (b"{}", {"Content-Type": "application/json; charset=no-such-codec"})):
                async with http.post(f"{base}/chat/completions", data=unreadable, headers=headers) as r:  # a 400, not a 500 the client retries
                    assert r.status == 400 and "not JSON" in (await r.json())["error"]["message"], unreadable[:20]
            async with http.post(f"{base}/chat/completions", json={**body, "pad": "x" * 9000}) as r:
                assert r.status == 413 and "max_request_bytes" in (await r.json())["error"]["message"]
            async with http.post(f"{base.replace(token, 'guessed')}/chat/completions", json=body) as r:
                assert r.status == 404
            door.close(token)
            async with http.post(f"{base}/chat/completions", json=body) as r:  # a finished session
                assert r.status == 404
            async with http.post(f"{other_base}/chat/completions", json=body) as r:
                assert r.status == 200
        await door.stop()
        return seen

    assert asyncio.run(main()) == ["checker", "checker"]  # the 404s reached no handler


# --- a program's episode ------------------------------------------------------------------------

def test_every_call_of_a_run_is_a_sample_numbered_per_agent_with_its_agents_reward():
    model = Model()
    episode = play(program("writer_and_checker"), model=model)
    assert episode.end_cause is None and model.calls == 4
    assert [(s.role, s.turn) for s in episode.samples] == [("writer", 0), ("checker", 0), ("writer", 1), ("checker", 1)]
    writer_reward = float(json.loads(json.dumps(episode.samples[2].response_ids)).count(ord("1")))
    assert all(s.reward == (writer_reward if s.role == "writer" else 1.0) for s in episode.samples)
    assert all(s.chosen and s.node == "" and s.global_reward == (writer_reward + 1.0) / 2 for s in episode.samples)
    # the checker's prompt holds the writer's reply as the program received it
    assert render(None, [{"role": "user", "content": f"check {bytes(episode.samples[0].response_ids).decode()!r}"}]) == episode.samples[1].prompt_ids
    assert episode.program == {"runs": 1, "calls": 4, "replayed_calls": 0, "diverged": 0, "resampled_nodes": 0}


def test_a_sync_program_gives_the_team_reward_and_its_sampling_values_reach_the_model():
    seen = []

    async def model(request, n, prompt_ids):
        seen.append(request.sampling)
        return Reply([ord("1")], [-0.1], {"role": "assistant", "content": "1"}, "stop", request.sampling.get("temperature"))

    episode = play(program("team_number", success_at=1.0), model=model, alpha=0.5)
    assert seen == [{"temperature": 0.5, "max_tokens": 3}]
    (sample,) = episode.samples
    assert episode.success and sample.reward == 0.5 and sample.global_reward == 1.0 and sample.temperature == 0.5


@pytest.mark.parametrize("name, cause", [
    ("raises", "program_error"), ("no_call", "program_no_call"), ("too_many_calls", "program_call_limit"), ("bad_reward", "program_error"),
])
def test_a_failed_program_loses_its_episode_by_cause(name, cause):
    assert cause in ERRORS
    episode = play(program(name, max_calls=5))
    assert episode.end_cause == cause and not episode.samples and not episode.success
    if name == "raises":
        assert "RuntimeError: the program broke" in str(episode.error)


def test_a_run_stopped_at_its_call_or_time_limit_trains_with_limit_reward_as_a_truncation():
    assert "program_limit" in TRUNCATIONS and "program_limit" not in ERRORS
    episode = play(program("too_many_calls", max_calls=5, limit_reward=-0.5), alpha=0.5)
    assert episode.end_cause == "program_limit" and "max_calls=5" in str(episode.error) and not episode.success
    assert [s.reward for s in episode.samples] == [-0.5] * 5 and episode.final_global_reward == -0.5  # each call, whatever alpha
    episode = play(program("calls_then_hangs", time_limit_s=10, limit_reward=-1.0))
    assert episode.end_cause == "program_limit" and "time_limit_s=10" in str(episode.error)
    assert [(s.role, s.reward) for s in episode.samples] == [("writer", -1.0)]


def test_in_a_tree_a_branch_stopped_at_its_call_limit_is_scored_by_limit_reward_and_not_chosen():
    writer_calls = []

    async def model(request, n, prompt_ids):  # the writer's first replies alternate: a '0' loops, a '1' ends
        text = "ok"
        if request.agent == "writer":
            writer_calls.append(None)
            text = "01"[len(writer_calls) % 2]
        ids = [ord(c) for c in text]
        return Reply(ids, [-0.5] * len(ids), {"role": "assistant", "content": text}, "stop", None)

    episode = play(program("loops_on_zero", max_calls=6, limit_reward=-1.0), k=4, model=model)
    assert episode.end_cause is None and episode.success
    first = sorted((s.reward, s.chosen) for s in episode.samples if s.node == "")
    assert first == [(-1.0, False), (-1.0, False), (1.0, False), (1.0, True)]  # the looping branches train, penalised
    assert episode.program["diverged"] == 0


def test_in_a_tree_where_every_branch_loops_the_episode_ends_with_the_chosen_one_truncated():
    calls = []

    async def model(request, n, prompt_ids):  # every writer reply loops
        calls.append(request.agent)
        text = "0" if request.agent == "writer" else "ok"
        return Reply([ord(c) for c in text], [-0.5] * len(text), {"role": "assistant", "content": text}, "stop", None)

    episode = play(program("loops_on_zero", max_calls=6, limit_reward=-1.0), k=4, model=model)
    assert episode.end_cause == "program_limit" and not episode.success and episode.final_global_reward == -1.0
    assert [(s.node, s.reward) for s in episode.samples] == [("", -1.0)] * 4  # node 0 alone: no replays of a looping run
    assert len(calls) == 4 * 6  # the four runs' calls up to the limit, nothing after


def test_a_last_line_that_python_will_not_read_as_json_is_named_as_the_reward_it_must_be():
    for last in ("9" * 5000, "[" * 5000 + "]" * 5000):  # a 5,000-digit number, and nesting deeper than Python reads
        episode = play(ProgramConfig(command=[sys.executable, "-c", f"print({last!r})"]))
        assert episode.end_cause == "program_error" and "last line must be its reward as JSON" in str(episode.error)


def test_a_program_past_its_time_limit_is_killed_with_its_children(tmp_path):
    pid_file = tmp_path / "pids"
    # a run stopped before its first call is a fault though limit_reward is set: it has nothing to train
    episode = play(program("hangs", time_limit_s=3, limit_reward=-1.0), task={"pid_file": str(pid_file)})
    assert episode.end_cause == "program_timeout" and "time_limit_s=3" in str(episode.error)
    def running(pid: int) -> bool:
        try:
            with open(f"/proc/{pid}/stat") as f:  # gone, or a zombie awaiting its reaper
                return f.read().split(") ")[1][0] not in "ZX"
        except FileNotFoundError:
            return False

    run, child = map(int, pid_file.read_text().split())
    assert not running(run)  # the run itself has exited when its episode ends
    deadline = time.monotonic() + 60  # its child got SIGKILL with it: it dies as soon as the kernel gets to it
    while running(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not running(child)


def test_a_command_program_reads_its_session_from_the_environment(tmp_path):
    script = tmp_path / "team.py"
    script.write_text(
        "import json, os\nfrom openai import OpenAI\n"
        "task = json.load(open(os.environ['PETTINGLLMS_TASK_FILE']))\n"
        "ai = OpenAI(max_retries=0)\n"  # OPENAI_BASE_URL and OPENAI_API_KEY from the environment
        "r = ai.chat.completions.create(model='checker', messages=[{'role': 'user', 'content': str(task['seed'])}])\n"
        "print('chatter first')\nprint(json.dumps({'checker': 0.25}))\n"
    )
    import sys

    episode = play(ProgramConfig(command=[sys.executable, str(script)]), seed=11)
    (sample,) = episode.samples
    assert sample.role == "checker" and sample.reward == 0.25 and sample.prompt_ids == render(None, [{"role": "user", "content": "11"}])


# --- AT-GRPO tree sampling by replay --------------------------------------------------------------

def test_a_tree_branches_each_call_k_ways_by_replaying_the_chosen_prefix():
    k = 3
    model = Model(seed=1)
    episode = play(program("writer_and_checker"), k=k, model=model)
    assert episode.end_cause is None and episode.program["diverged"] == 0
    nodes: dict[str, list] = {}
    for s in episode.samples:
        nodes.setdefault(s.node, []).append(s)
    assert len(nodes) == 4 and all(len(branches) == k for branches in nodes.values())  # one node per call of the chosen run
    path = ""
    for j, (node, branches) in enumerate(nodes.items()):
        assert node == path
        assert len({tuple(s.prompt_ids) for s in branches}) == 1  # K replies to one prompt
        assert [(s.role, s.turn) for s in branches] == [(("writer", "checker")[j % 2], j // 2)] * k
        best = max(range(k), key=lambda b: (branches[b].reward, -b))
        assert [s.chosen for s in branches] == [b == best for b in range(k)]
        path = f"{path}.{best}" if path else str(best)
    # node 0: K runs; each later node: the chosen run goes on, K - 1 replays serve its first j calls from the cache
    assert episode.program["runs"] == k + 3 * (k - 1)
    assert episode.program["replayed_calls"] == (k - 1) * (1 + 2 + 3) and episode.program["calls"] == 4 * (k + 3 * (k - 1))
    assert model.calls == 4 * k + (k - 1) * (3 + 2 + 1)  # every run samples from its node's call on


class Pushed(Model):
    """A stand-in policy whose weights are pushed after each call count in ``after``: each reply
    carries the version it came from (the pushes before it)."""

    def __init__(self, after, seed: int = 1):
        super().__init__(seed)
        self.after = after

    async def __call__(self, request, n, prompt_ids) -> Reply:
        reply = await super().__call__(request, n, prompt_ids)
        return replace(reply, versions=frozenset({sum(self.calls > count for count in self.after)}))


def test_a_node_whose_branches_a_weight_push_split_is_played_again_on_one_version():
    """An asynchronous trainer's push between a node's K branch calls: its K runs are played again
    from the node's prefix until they come from one version (at most NODE_TRIES samplings; then the
    node keeps what it has), as an environment's node is sampled again."""
    from pettingllms_verl.episodes.core import NODE_TRIES

    k = 3
    once = play(program("writer_and_checker"), k=k, model=Pushed(after=[2]))  # pushed after the 2nd call: node 0's K first calls straddle it
    assert once.end_cause is None and once.program["resampled_nodes"] == 1
    assert once.program["runs"] == 2 * k + 3 * (k - 1)  # node 0 played twice, every later node on one version
    always = play(program("writer_and_checker"), k=k, model=Pushed(after=range(1000)))  # a push after every call: no node is ever whole
    assert always.end_cause is None and always.program["resampled_nodes"] == 4 * (NODE_TRIES - 1)
    for episode in (once, always):  # each node still K branches, one chosen
        nodes: dict[str, list] = {}
        for s in episode.samples:
            nodes.setdefault(s.node, []).append(s)
        assert len(nodes) == 4 and all(len(branches) == k and sum(s.chosen for s in branches) == 1 for branches in nodes.values())


def test_a_replay_that_asks_something_else_is_counted_and_trained_as_an_independent_run():
    episode = play(program("unreplayable"), k=2)
    assert episode.program["diverged"] >= 1
    diverged = [s for s in episode.samples if s.node == DIVERGED_NODE]
    assert diverged and all(not s.chosen for s in diverged)
    tree = [s for s in episode.samples if s.node != DIVERGED_NODE]
    assert len(tree) < 2 * 2  # the diverged branches left their nodes


# --- the same rows as the native environment --------------------------------------------------------

EXAMPLE = os.path.join(EXAMPLES, "plan_path_openai.py")
SCRIPT = {  # (role, turn) -> the reply both paths receive
    ("tool", 0): "```python\nprint('R D')\n```", ("plan", 0): "Moves: R D R",
    ("tool", 1): "```python\nimport sys\nprint(sys.stdin.read()[:0] + 'L')\n```", ("plan", 1): "no moves here",
}



def example_program(example: str) -> ProgramConfig:
    """``examples/agents/<example>.py`` as the recipe plays it: the AutoGen team as a command in its environment."""
    if example != "plan_path_autogen":
        return ProgramConfig(target=f"{EXAMPLES}/{example}.py:team")
    assert os.path.isfile(AUTOGEN_PYTHON), f"{AUTOGEN_PYTHON} is missing: make install-autogen builds it"
    return ProgramConfig(command=[AUTOGEN_PYTHON, f"{EXAMPLES}/{example}.py"])


@pytest.mark.parametrize("example", ["plan_path_openai", "plan_path_langgraph", "plan_path_agents_sdk", "plan_path_autogen"])
def test_the_plan_path_program_sends_the_native_environments_prompts_token_for_token(tiny_model_dir, example):
    """For one task and the same replies, each example program's calls (bare openai, LangGraph,
    Agents SDK, AutoGen AgentChat as a command) are the native Plan-Path episode's rows: equal prompt
    and reply token ids, role by role, turn by turn."""
    from transformers import AutoTokenizer

    from pettingllms_verl import envs
    from pettingllms_verl.episodes.core import run_episode

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    options = {"size": 6, "max_turns": 2}
    env = envs.make("plan_path", **options)
    env.reset(seed=5)

    def render_(role, messages, tools=None):
        return list(tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False))

    def decode(role, ids):
        return tokenizer.decode(ids, skip_special_tokens=True)

    turns: dict[str, int] = {}

    async def native_generate(role, prompt_ids, n):
        turn = turns.get(role, 0)
        turns[role] = turn + 1
        return [(tokenizer.encode(SCRIPT[role, turn]), [0.0])]

    async def program_sample(request, n, prompt_ids):
        ids = tokenizer.encode(SCRIPT[request.agent, n])
        return Reply(ids, [0.0] * len(ids), {"role": "assistant", "content": decode(request.agent, ids)}, "stop")

    native = asyncio.run(run_episode(env, ("tool", "plan"), 2, k=1, alpha=1.0, generate=native_generate, render=render_, decode=decode))

    async def main():
        door = Gateway()
        await door.start()
        problem = {"env": "plan_path", "seed": 5, "task": env.task, "env_kwargs": options}
        try:
            # a threshold every reward passes: the episode's success must be the program's own word
            return await play_program(replace(example_program(example), success_at=-10.0), problem, ("tool", "plan"), 1, 1.0, door, render_, program_sample)
        finally:
            await door.stop()

    ours = asyncio.run(main())
    assert ours.end_cause is None and len(native.samples) == 4
    assert [(s.role, s.turn, s.prompt_ids, s.response_ids) for s in ours.samples] == [
        (s.role, s.turn, s.prompt_ids, s.response_ids) for s in native.samples
    ]
    assert not native.success and not ours.success  # the puzzle's own word (unsolved), returned with the rewards


def test_the_math_team_solves_verifies_and_is_graded_by_math_verify():
    """The LangGraph solver + verifier: an accepted right answer ends after one round with reward 1;
    a rejected wrong one goes back to the solver with the verifier's words, up to max_turns rounds."""
    problem = {"env": "math", "seed": 0, "task": {"problem": "What is 17 \\times 23?", "answer": "391"}, "env_kwargs": {"max_turns": 2}}
    config = ProgramConfig(target=f"{EXAMPLES}/math_solver_verifier.py:team")

    def scripted(replies: dict):
        prompts = []

        async def model(request, n, prompt_ids):
            prompts.append((request.agent, request.messages[-1]["content"]))
            text = replies[request.agent, n]
            return Reply([ord(c) % 997 for c in text], [0.0] * len(text), {"role": "assistant", "content": text}, "stop")

        return model, prompts

    async def main(model):
        door = Gateway()
        await door.start()
        try:
            return await play_program(config, problem, ("solver", "verifier"), 1, 1.0, door, render, model)
        finally:
            await door.stop()

    model, _ = scripted({("solver", 0): "17*23 = \\boxed{391}", ("verifier", 0): "ACCEPT"})
    right = asyncio.run(main(model))
    assert right.success and [(s.role, s.turn, s.reward) for s in right.samples] == [("solver", 0, 1.0), ("verifier", 0, 1.0)]
    model, prompts = scripted({("solver", 0): "\\boxed{390}", ("verifier", 0): "REJECT: 17*23 ends in 1",
                               ("solver", 1): "\\boxed{390}", ("verifier", 1): "REJECT"})
    wrong = asyncio.run(main(model))
    assert not wrong.success and [s.reward for s in wrong.samples] == [0.0] * 4
    assert prompts[2] == ("solver", "What is 17 \\times 23?\n\nA previous solution was rejected: REJECT: 17*23 ends in 1")


# --- runs forked from a warm process -----------------------------------------------------------------

def test_a_function_programs_runs_are_forked_from_one_warm_server(tmp_path):
    from pettingllms_verl.programs import program as programs

    out = tmp_path / "ppid"
    config = program("parent_pid")
    assert play(config, task={"out": str(out)}).success
    server = programs._servers[(config.target, os.environ.get("PETTINGLLMS_LAUNCH_DIR"))]
    first = int(out.read_text())
    assert first == server._process.pid != os.getpid() and server.fork_safe
    assert play(config, task={"out": str(out)}).success and int(out.read_text()) == first  # the same server again


def test_a_module_that_starts_threads_is_not_forked_from_and_one_that_fails_to_load_fails_its_runs(tmp_path):
    threads = tmp_path / "threaded.py"
    threads.write_text(
        "import os, threading, time\nthreading.Thread(target=time.sleep, args=(600,), daemon=True).start()\n"
        f"exec(open({PROGRAMS!r}).read())\n"
    )
    out = tmp_path / "ppid"
    episode = play(ProgramConfig(target=f"{threads}:parent_pid"), task={"out": str(out)})
    assert episode.success and int(out.read_text()) == os.getpid()  # spawned by this process, as a command is
    broken = tmp_path / "broken.py"
    broken.write_text("import no_such_framework_here\n\ndef team(task, client):\n    return 1.0\n")
    episode = play(ProgramConfig(target=f"{broken}:team"))
    assert episode.end_cause == "program_error" and "no_such_framework_here" in str(episode.error)


def test_a_reply_with_a_tool_call_reaches_the_program_as_tool_calls(tiny_model_dir):
    """Where the request offered tools, verl's hermes parser reads calls out of the sampled ids; the
    program gets them as tool_calls (with ids a replay repeats), the rest as text."""
    from transformers import AutoTokenizer
    from verl.experimental.agent_loop.tool_parser import ToolParser

    from pettingllms_verl.programs.episode import assistant_reply

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    parser = ToolParser.get_tool_parser("hermes", tokenizer)
    tools = [{"type": "function", "function": {"name": "move", "parameters": {"type": "object"}}}]
    request = parse_request({"model": "writer", "messages": [{"role": "user", "content": "go"}], "tools": tools, "temperature": 0}, AGENTS)
    ids = tokenizer.encode('ok <tool_call>{"name": "move", "arguments": {"to": "R"}}</tool_call>')

    def decode(ids):
        return tokenizer.decode(ids, skip_special_tokens=True)

    reply = asyncio.run(assistant_reply(request, 2, ids, [0.0] * len(ids), 100, decode, parser, tokenizer.all_special_tokens))
    assert reply.finish_reason == "tool_calls" and reply.response_ids == ids and reply.temperature == 1.0  # greedy: scored at 1
    assert reply.message["tool_calls"] == [{"id": "call_writer_2_0", "type": "function", "function": {"name": "move", "arguments": '{"to": "R"}'}}]
    assert reply.message["content"].strip() == "ok"
    plain = parse_request({"model": "writer", "messages": [{"role": "user", "content": "go"}]}, AGENTS)
    text = asyncio.run(assistant_reply(plain, 0, ids[:3], [0.0] * 3, 3, decode, None))
    assert text.message == {"role": "assistant", "content": decode(ids[:3])} and text.finish_reason == "length" and text.temperature is None


@pytest.mark.parametrize("spawned", [False, True])
def test_a_program_that_prints_without_end_costs_a_bounded_tail(tmp_path, spawned):
    """Only the last OUTPUT_BYTES of a run's output are kept, forked or spawned; its reward, the last line, is read."""
    if spawned:  # the same program as a command
        config = ProgramConfig(command=[sys.executable, "-m", "pettingllms_verl.programs.runner", f"{PROGRAMS}:chatty"])
    else:
        config = program("chatty")
    episode = play(config)
    assert episode.end_cause is None and [s.reward for s in episode.samples] == [0.5]


def test_a_runs_output_is_kept_to_its_last_bytes():
    from pettingllms_verl.programs.program import OUTPUT_BYTES, _tail

    async def main():
        reader = asyncio.StreamReader()
        for i in range(3):
            reader.feed_data(bytes([65 + i]) * OUTPUT_BYTES)
        reader.feed_eof()
        return await _tail(reader)

    assert asyncio.run(main()) == b"C" * OUTPUT_BYTES


def test_a_forked_run_that_raises_after_printing_a_reward_is_a_program_error():
    episode = play(program("prints_then_raises"))
    assert episode.end_cause == "program_error" and "after its reward" in str(episode.error)


@pytest.mark.parametrize("spawned", [False, True])
def test_a_run_that_returns_leaving_a_child_is_over_when_it_exits(spawned):
    """Its reward counts (no timeout), and the child it left is killed with its group."""
    config = program("leaves_a_child", time_limit_s=60)
    if spawned:
        config = ProgramConfig(command=[sys.executable, "-m", "pettingllms_verl.programs.runner", config.target], time_limit_s=60)
    started = time.monotonic()
    episode = play(config)
    assert episode.end_cause is None and [s.reward for s in episode.samples] == [0.25]
    assert time.monotonic() - started < 55  # over when the program returned, not at its limit


def test_a_large_task_reaches_the_program():
    task = {"tests": "x" * (1 << 20)}  # more than an environment variable or a socket message holds
    seen = []

    async def model(request, n, prompt_ids):
        seen.append(request.messages[-1]["content"])
        return Reply([49], [0.0], {"role": "assistant", "content": "1"}, "stop")

    episode = play(program("team_number"), model=model, task=task)
    assert episode.success and seen == ["go"]


def test_a_tree_over_agents_that_run_together_branches_each_call_once():
    """Replayed calls return at once and reorder a run's calls; nodes are chosen by key, so no reply
    is a node twice and every call of the chosen run is branched."""
    k = 2

    class Slow(Model):
        async def __call__(self, request, n, prompt_ids):
            await asyncio.sleep(0.05 if request.agent == "writer" else 0.03)
            return await super().__call__(request, n, prompt_ids)

    episode = play(program("concurrent_agents"), k=k, model=Slow(seed=3))
    assert episode.end_cause is None and episode.program["diverged"] == 0
    nodes: dict[str, list] = {}
    for s in episode.samples:
        nodes.setdefault(s.node, []).append(s)
    keys = [(branches[0].role, branches[0].turn) for branches in nodes.values()]
    assert sorted(keys) == [("checker", 0), ("checker", 1), ("writer", 0), ("writer", 1)]  # each call once
    assert all(len(branches) == k and len({tuple(s.prompt_ids) for s in branches}) == 1 for branches in nodes.values())


def test_a_diverged_replays_calls_meet_other_runs_calls_in_their_groups():
    from pettingllms_verl.rollout.agent_loop import group_key
    from pettingllms_verl.episodes.core import Sample

    settings = load({"roles": {"writer": {}}})  # tree mode
    assert settings.rollout_mode == "tree"

    def sample(node):
        return Sample(prompt_ids=[1], response_ids=[2], log_probs=[0.0], turn=1, role="writer", node=node, branch=0,
                      local_reward=0.0, global_reward=0.0, reward=0.0, parse_ok=True)

    assert group_key("u", 3, sample(DIVERGED_NODE), settings) == group_key("u", 4, sample(DIVERGED_NODE), settings) == "u|t1|writer|indep"
    assert group_key("u", 3, sample("0.1"), settings) == "u|t1|writer|s3:0.1"
