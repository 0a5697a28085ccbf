"""A fault costs one episode, counted, never the step: the real agent loop (``EpisodeAgentLoop.run``)
with a scripted server and a Plan-Path environment that fails on purpose."""

import json
import logging
import os
import signal

import pytest
import ray
from transformers import AutoTokenizer

from pettingllms_verl import envs
from pettingllms_verl.envs.images import draw_grid, image_part
from pettingllms_verl.envs.plan_path.env import PlanPathEnv
from pettingllms_verl.rollout import agent_loop
from pettingllms_verl.episodes.tags import ERRORS
from pettingllms_verl.rollout.faults import FaultTally, RunStopped
from pettingllms_verl.trainer.metrics import episode_metrics

from support.episodes import K, ReplyingServer, ScriptedServer, play_env

ROLES_PER_TURN = 2  # plan_path: tool, then plan


class FaultyPlanPath(PlanPathEnv):
    """Plan-Path that fails from turn ``fault_turn`` on: its ``step`` raises (``fault=step``), its
    prompts outgrow any budget (``fault=overflow``), or hold an image the text model's chat cannot
    render (``fault=unrenderable``)."""

    options = {**PlanPathEnv.options, "fault": "step | overflow | unrenderable", "fault_turn": "first turn that fails"}

    def reset(self, seed, task=None):
        super().reset(seed, task)
        self.nodes = 0  # nodes played so far (copied into every clone: the continuing branch keeps it)

    def _failing(self) -> bool:
        return self.nodes > self.config["fault_turn"] * ROLES_PER_TURN

    def observation(self, role):
        self.nodes += 1
        messages = super().observation(role)
        if self.config["fault"] == "overflow" and self._failing():
            messages[-1] = {**messages[-1], "content": messages[-1]["content"] + " wall" * 2000}
        if self.config["fault"] == "unrenderable" and self._failing():
            image = image_part(draw_grid(["#"], {"#": (0, 0, 0)}))
            messages[-1] = {**messages[-1], "content": [image, {"type": "text", "text": messages[-1]["content"]}]}
        return messages

    def step(self, role, text):
        if self.config["fault"] == "step" and self._failing():
            raise RuntimeError("the environment broke")
        return super().step(role, text)



@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def play(tokenizer, server, settings: dict | None = None, **env_kwargs) -> list:
    source = envs.make("plan_path", size=4)
    source.reset(seed=3)
    # registered for this episode only (the tiny tokenizer's corpus is built from every registered env)
    envs.register_env("faulty_plan_path", f"{__name__}:FaultyPlanPath")
    try:
        return play_env(tokenizer, server, "faulty_plan_path", source.task, settings, max_turns=4, size=4, **env_kwargs)
    finally:
        del envs._ENVS["faulty_plan_path"]



def end_of(outputs) -> dict:
    (end,) = [o.extra_fields for o in outputs if o.extra_fields["mas_episode_end"]]
    assert end is outputs[-1].extra_fields
    return end


def test_every_request_of_an_episode_carries_one_request_id(tokenizer):
    """Its K branches, roles and turns: the load balancer keeps the episode on one replica, whose
    prefix cache (vLLM's, or the hf engine's shared prefill) holds its prompts; another episode, another id."""
    server = ScriptedServer(tokenizer)
    play(tokenizer, server, fault="none", fault_turn=0)  # a plain Plan-Path episode: 4 turns, 2 roles, K branches
    first = server.calls
    play(tokenizer, server, fault="none", fault_turn=0)
    ids = server.request_ids
    assert first == 4 * ROLES_PER_TURN * K and len(ids) == 2 * first  # every branch of every node asked the server
    assert len(set(ids[:first])) == 1 and len(set(ids[first:])) == 1 and ids[0] != ids[-1]


def test_an_env_that_raises_ends_only_its_episode_keeping_the_turns_played(tokenizer, caplog):
    agent_loop._logged_causes.clear()
    with caplog.at_level(logging.WARNING, logger=agent_loop.__name__):
        outputs = play(tokenizer, ScriptedServer(tokenizer), fault="step", fault_turn=1)
        again = play(tokenizer, ScriptedServer(tokenizer), fault="step", fault_turn=1)
    assert [o.extra_fields["mas_turn"] for o in outputs] == [0] * (K * ROLES_PER_TURN)  # turn 0 kept, turn 1 failed
    assert all(sum(o.response_mask) > 0 for o in outputs)
    end = end_of(outputs)
    assert (end["mas_end_cause"], end["mas_success"]) == ("env_error", False)
    assert end_of(again)["mas_end_cause"] == "env_error"
    # the first traceback of a cause is logged once per process, not once per episode
    logged = [r for r in caplog.records if "ended by env_error" in r.getMessage()]
    assert len(logged) == 1 and "RuntimeError: the environment broke" in logged[0].getMessage()


def test_a_prompt_that_outgrows_the_budget_at_turn_3_ends_the_episode_truncated(tokenizer):
    outputs = play(tokenizer, ScriptedServer(tokenizer), fault="overflow", fault_turn=3)
    assert sorted({o.extra_fields["mas_turn"] for o in outputs}) == [0, 1, 2]
    assert len(outputs) == 3 * ROLES_PER_TURN * K
    assert end_of(outputs)["mas_end_cause"] == "prompt_overflow"


def test_a_prompt_the_chat_cannot_render_ends_its_episode_not_the_batch(tokenizer):
    """The chat template or processor refusing an episode's messages (here an image for a text
    model) is that episode's env_error; the turns before it are kept."""
    outputs = play(tokenizer, ScriptedServer(tokenizer), fault="unrenderable", fault_turn=2)
    assert sorted({o.extra_fields["mas_turn"] for o in outputs}) == [0, 1]
    assert end_of(outputs)["mas_end_cause"] == "env_error"


def test_an_engine_error_before_any_reply_leaves_one_untrained_row_for_the_episode(tokenizer):
    (output,) = play(tokenizer, ScriptedServer(tokenizer, fail_from=1), fault="step", fault_turn=9)
    assert output.response_mask == [0] * len(output.response_ids)  # counted, never trained on
    assert output.extra_fields["mas_placeholder"] and output.extra_fields["mas_end_cause"] == "engine_error"
    assert output.extra_fields["mas_success"] is False


def test_a_dead_server_ends_the_episode_as_engine_dead_naming_the_policy_and_rays_cause(tokenizer):
    """Ray's ActorDiedError (the actor's process is gone: killed, out of memory) is no failed request:
    the episode ends ``engine_dead`` with the policy and Ray's message in its row, and the run's fault
    check stops on it whatever the budget; a server Ray only cannot reach for now stays one request's fault."""
    died = ray.exceptions.ActorDiedError()  # its message: "The actor died unexpectedly before finishing this task."
    outputs = play(tokenizer, ScriptedServer(tokenizer, fail_from=3, error=died), fault="step", fault_turn=9)
    end = end_of(outputs)
    assert end["mas_end_cause"] == "engine_dead" and end["mas_success"] is False
    assert "EngineDead: policy 'shared' (role plan): its rollout server is dead. The actor died unexpectedly" in end["mas_error"]
    tally = FaultTally()
    tally.add_tags([o.extra_fields for o in outputs])
    with pytest.raises(RunStopped, match=r"^pettingllms-verl stopped the run: validation: a rollout server is dead \(1 of 1 episodes") as stop:
        tally.check(budget=1.0, where="validation")
    assert "--- first engine_dead ---" in str(stop.value) and "The actor died unexpectedly" in str(stop.value)
    restarting = ray.exceptions.ActorUnavailableError("restarting", None)
    unavailable = play(tokenizer, ScriptedServer(tokenizer, fail_from=1, error=restarting), fault="step", fault_turn=9)
    assert end_of(unavailable)["mas_end_cause"] == "engine_error"


def test_the_fault_budget_is_a_share_of_episodes_and_names_counts_and_first_tracebacks():
    tally = FaultTally()
    for cause, error in [(None, None), ("max_turns", None), ("env_error", "Traceback A"), ("env_error", "Traceback B")]:
        tally.add(cause, error)
    assert tally.share == 0.5  # a truncation is no fault
    tally.check(budget=0.5, where="training step 3")  # at the budget: the faults cost their episodes only
    assert tally.metrics() == {"mas/fault_share": 0.5, **{f"mas/fault_share/{cause}": 0.5 if cause == "env_error" else 0.0 for cause in ERRORS}}
    assert {"engine_error", "env_error", "engine_dead", "program_error", "program_timeout"} <= set(ERRORS)
    tally.add("engine_error", "Traceback C")
    with pytest.raises(RunStopped) as stop:
        tally.check(budget=0.5, where="training step 3")
    message = str(stop.value)
    assert message.startswith("pettingllms-verl stopped the run: training step 3: 3 of 5 episodes ended by a fault "
                              "(engine_error 1, env_error 2), a share of 0.60, over pettingllms.trainer.fault_budget=0.5")
    assert "--- first engine_error ---\nTraceback C" in message and "--- first env_error ---\nTraceback A" in message
    assert "Traceback B" not in message  # the first of each cause only
    FaultTally().check(budget=0.0, where="an empty pass")  # no episodes, no faults


def test_faulty_episodes_count_as_failures_per_cause(tokenizer):
    episodes = [
        play(tokenizer, ScriptedServer(tokenizer), fault="step", fault_turn=1),
        play(tokenizer, ScriptedServer(tokenizer), fault="overflow", fault_turn=2),
        play(tokenizer, ScriptedServer(tokenizer, fail_from=3), fault="step", fault_turn=9),
        play(tokenizer, ScriptedServer(tokenizer, fail_from=1), fault="step", fault_turn=9),
        play(tokenizer, ScriptedServer(tokenizer), fault="step", fault_turn=9),  # no fault: out of turns
    ]
    metrics = episode_metrics([o.extra_fields for outputs in episodes for o in outputs])
    assert metrics["mas/success"] == 0.0  # every episode counted, the failed ones as failures
    assert metrics["mas/episode_errors"] == 3 and metrics["mas/truncated"] == 2
    assert (metrics["mas/episode_errors/env_error"], metrics["mas/episode_errors/engine_error"]) == (1, 2)
    assert (metrics["mas/truncated/prompt_overflow"], metrics["mas/truncated/max_turns"]) == (1, 1)
    assert (metrics["mas/fault_share"], metrics["mas/fault_share/engine_error"]) == (3 / 5, 2 / 5)
    # the placeholder row is no reply: it does not count as a parse failure
    assert metrics["mas/parse_failure_rate"] == pytest.approx(
        sum(not o.extra_fields["mas_parse_ok"] for outputs in episodes for o in outputs if not o.extra_fields["mas_placeholder"])
        / sum(not o.extra_fields["mas_placeholder"] for outputs in episodes for o in outputs)
    )


def test_every_episode_is_logged_with_its_prompts_replies_rewards_and_branches(tokenizer, tmp_path):
    class Hostile(ScriptedServer):
        def __init__(self, tokenizer):
            super().__init__(tokenizer)
            self.reply = tokenizer.encode("<script>alert(1)</script>")

    outputs = play(tokenizer, Hostile(tokenizer), {"paths": {"episode_log_dir": str(tmp_path)}}, fault="overflow", fault_turn=2)
    (log,) = tmp_path.glob("episodes-*.jsonl")
    (record,) = [json.loads(line) for line in log.read_text().splitlines()]
    assert (record["env"], record["seed"], record["validate"], record["end_cause"]) == ("faulty_plan_path", 3, False, "prompt_overflow")
    samples = record["samples"]
    assert len(samples) == len(outputs) == 2 * ROLES_PER_TURN * K  # every branch of the 2 turns played
    assert [(s["turn"], s["role"]) for s in samples[:K]] == [(0, "tool")] * K
    assert sum(s["chosen"] for s in samples) == 2 * ROLES_PER_TURN  # one chosen branch per node
    reply = tokenizer.decode(Hostile(tokenizer).reply[:16], skip_special_tokens=True)  # response_length = 16
    assert all(s["reply"] == reply for s in samples)
    assert "<script>" in samples[0]["reply"]  # stored as it came; a viewer escapes it
    assert samples[0]["prompt"] == samples[1]["prompt"] and "start" in samples[0]["prompt"].lower()
    assert {"local_reward", "global_reward", "reward", "parse_ok", "node", "branch", "policy"} <= samples[0].keys()
    # the state: before the first reply, and each branch's after its reply (Env.snapshot: the plan agent moves @)
    assert set(record["start"]) == {"grid", "pos", "goal"} and record["swapped"] is False
    assert all(s["state"]["grid"] == record["start"]["grid"] for s in samples)
    assert record["policies"] == {"tool": "shared", "plan": "shared"} and record["served_by"]["plan"] == ["shared"]



def test_a_sandbox_server_killed_mid_step_is_replaced_and_costs_no_episode(tokenizer):
    """The fork server dies (SIGKILL) after the episode began and before its tool program runs:
    the program runs on a restarted server, and the episode plays out with nothing lost."""
    from pettingllms_verl.sandbox import client, run_python

    assert run_python("print(1)").ok
    killed = client._current_server().process

    def kill_the_server():
        killed.kill()
        killed.wait()

    server = ReplyingServer(tokenizer, "```python\nprint('R R D D')\n```", before_first=kill_the_server)
    source = envs.make("plan_path", size=4)
    source.reset(seed=3)
    outputs = play_env(tokenizer, server, "plan_path", source.task, max_turns=1, size=4)
    assert killed.returncode == -9 and client._current_server().process is not killed
    tool = [o.extra_fields for o in outputs if o.extra_fields["mas_role"] == "tool"]
    end = end_of(outputs)
    assert len(tool) == K and all(t["mas_sandbox_runs"] == {"ok": 1} for t in tool), end  # every program ran
    assert end["mas_end_cause"] not in ERRORS and len(outputs) == K * ROLES_PER_TURN
    metrics = episode_metrics([o.extra_fields for o in outputs])
    assert metrics["mas/episode_errors"] == 0 and metrics["mas/tool/sandbox/ok"] == K


def test_a_hanging_grader_is_killed_and_only_the_answer_it_held_counts_as_wrong(tokenizer, monkeypatch):
    """The grader's child process hangs (SIGSTOP: it never answers) when the episode's answers
    are graded: the wait ends at the caller's bound, the hung child is killed and that one answer
    counts as wrong; the other branch's (identical, right) answer is graded by another child (of the
    pool, or a fresh one), and the episode plays out with no error."""
    from pettingllms_verl.envs.math import grading as math_grading

    assert math_grading.equivalent("3", "3")
    first = math_grading._pool._idle.queue[-1]  # the grader the next call reaches first
    monkeypatch.setattr(first, "timeout_s", 1)  # its bound: 3 x 1 s + 1 s instead of 16 s (the others grade as usual)
    hung = first._process
    os.kill(hung.pid, signal.SIGSTOP)
    task = {"problem": "What is 1 + 2?", "answer": "3"}
    outputs = play_env(tokenizer, ReplyingServer(tokenizer, "\\boxed{3}"), "math", task, response_length=32, max_turns=1)
    assert hung.returncode == -signal.SIGKILL  # killed at the bound, not left behind
    reasoner = [o.extra_fields for o in outputs if o.extra_fields["mas_role"] == "reasoner"]
    assert len(reasoner) == K and all(r["mas_parse_ok"] for r in reasoner)
    rewards = sorted(r["mas_local_reward"] for r in reasoner)
    assert rewards[0] < rewards[1] == 1.0  # the one answer the hung child held scored as wrong
    end = end_of(outputs)
    assert end["mas_success"] and end["mas_end_cause"] not in ERRORS  # the episode went on, on the right branch
    assert episode_metrics([o.extra_fields for o in outputs])["mas/episode_errors"] == 0


@pytest.mark.parametrize("mode", ["independent", "tree"])
def test_a_failed_episode_never_joins_the_group_of_real_replies(tokenizer, mode):
    """Three episodes of one problem reply at turn 0; a fourth fails before its first reply. Its
    placeholder's zero reward must not move the real replies' advantages (rewards [1, 1, 0.5] give
    [0.58, 0.58, -1.15]; pooled with the placeholder's 0 they would give [0.78, 0.78, -0.26])."""
    import torch

    from pettingllms_verl.algo import compute_at_grpo_advantage

    settings = {"rollout_mode": mode}
    played = play(tokenizer, ScriptedServer(tokenizer), settings, fault="step", fault_turn=9)
    (placeholder,) = play(tokenizer, ScriptedServer(tokenizer, fail_from=1), settings, fault="step", fault_turn=9)
    assert placeholder.extra_fields["mas_placeholder"]
    real_keys = {o.extra_fields["mas_group"] for o in played}
    assert placeholder.extra_fields["mas_group"] not in real_keys
    # the three real first-turn replies of the tool role, as in independent mode (one group across episodes)
    first = next(o.extra_fields["mas_group"] for o in played if o.extra_fields["mas_turn"] == 0)
    index = [first, first, first, placeholder.extra_fields["mas_group"]]
    rewards = torch.tensor([[1.0], [1.0], [0.5], [0.0]])
    advantages, _ = compute_at_grpo_advantage(rewards, torch.ones_like(rewards), index)
    assert advantages[:3, 0].tolist() == pytest.approx([0.577, 0.577, -1.155], abs=1e-3)
    assert advantages[3, 0] == 0.0


def test_each_row_carries_the_temperature_its_reply_is_trained_at(tokenizer):
    """A role's own temperature, else the rollout's (1.0 here); greedy replies are scored at 1, as
    the rollouts record their log-probs (docs/training.md)."""
    settings = {"roles": {"plan": {"sampling": {"temperature": 0.5}}, "tool": {"sampling": {"temperature": 0}}}}
    outputs = play(tokenizer, ScriptedServer(tokenizer), settings, fault="step", fault_turn=9)
    assert {(o.extra_fields["mas_role"], o.extra_fields["mas_temperature"]) for o in outputs} == {("plan", 0.5), ("tool", 1.0)}
    outputs = play(tokenizer, ScriptedServer(tokenizer), fault="step", fault_turn=9)
    assert {o.extra_fields["mas_temperature"] for o in outputs} == {1.0}


class PushedServer(ScriptedServer):
    """Answers at weight version 3 until the ``push_at``-th request, then at 4: a weight push that
    lands between two branches of one tree node, as an asynchronous trainer's can."""

    def __init__(self, tokenizer, push_at: int):
        super().__init__(tokenizer)
        self.push_at = push_at

    async def generate(self, request_id, prompt_ids, sampling_params, policy=None):
        out = await super().generate(request_id, prompt_ids, sampling_params, policy)
        out.extra_fields["global_steps"] = 3 if self.calls < self.push_at else 4
        return out


def test_a_tree_node_split_by_a_weight_push_is_sampled_again_so_its_branches_share_one_version(tokenizer):
    """K = 2: the first node's first branch answers at version 3, its second at 4. The node is
    sampled again (both branches at 4) and counted; every row records its role's versions, which
    set verl's per-row staleness fields."""
    server = PushedServer(tokenizer, push_at=2)
    outputs = play(tokenizer, server, fault="none", fault_turn=0)
    assert server.calls == 4 * ROLES_PER_TURN * K + K  # every node once, the split one twice
    end = end_of(outputs)
    assert end["mas_resampled_nodes"] == 1 and episode_metrics([end])["mas/resampled_nodes"] == 1.0
    assert not end["mas_straddled"]  # every reply it kept is from version 4
    for out in outputs:
        tags = out.extra_fields
        assert tags["mas_weight_versions"] == [4]  # the discarded branch's version 3 is nowhere
        assert tags["min_global_steps"] == tags["max_global_steps"] == 4

    unsplit = play(tokenizer, ScriptedServer(tokenizer), fault="none", fault_turn=0)
    assert end_of(unsplit)["mas_resampled_nodes"] == 0

    # a push between two nodes: the episode goes on with the newer weights, counted as straddling one
    straddled = end_of(play(tokenizer, PushedServer(tokenizer, push_at=K + 1), fault="none", fault_turn=0))
    assert straddled["mas_resampled_nodes"] == 0 and straddled["mas_straddled"]
    assert episode_metrics([straddled])["mas/straddled_episodes"] == 1.0
