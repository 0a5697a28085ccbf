"""Team programs trained through ``main_ppo``, their calls served through the gateway by the
rollout's servers and trained with AT-GRPO: the example Plan-Path team with the OpenAI Agents SDK
(``examples/agents/plan_path_agents_sdk.py``, an agent per policy), evaluated as the bare ``openai``
client's version of the same team (``plan_path_openai.py``); the LangGraph math team (a solver and a
verifier, ``math_solver_verifier.py``) on one shared policy; the AutoGen AgentChat team
(``plan_path_autogen.py``) as a command in an environment of its own, a LoRA adapter per agent."""

import html
import json
import os
import sys
from collections import Counter, defaultdict

import pytest

import launch

from test_programs import EXAMPLES, example_program
from test_mas_e2e import RECIPES, artifacts, dumped_rows, run_recipe, write_math_fixture  # noqa: F401 (artifacts: the module's fixture)

pytestmark = pytest.mark.slow


def program(example: str) -> str:
    """The override that plays ``examples/agents/<example>.py`` (an absolute path: the tests start main_ppo in their artifacts folder)."""
    return f"pettingllms.program.target={os.path.abspath(os.path.join(EXAMPLES, example))}.py:team"


def test_a_program_trains_a_full_model_and_an_adapter_with_tree_sampling_by_replay(artifacts):
    """L2 + L1 in one run: the tool agent a full model of its own, the planner a LoRA adapter on the
    base; K = 2 branches per call, replayed. Each agent's calls reach its own policy, each tree node
    is a group of K replies to one prompt, and both policies are updated."""
    dump = artifacts / "program_batches"
    metrics = run_recipe(
        artifacts, "plan_path_program_cpu", program("plan_path_agents_sdk"), "trainer.total_training_steps=1", "+pettingllms.policies.plan_policy.adapter.rank=8",
        f"pettingllms.paths.batch_dump_dir={dump}",
    )
    data = metrics[0]["data"]
    for policy in ("tool_policy", "plan_policy"):
        assert data[f"policy/{policy}/rows"] > 0 and f"policy/{policy}/actor/grad_norm" in data
        assert data[f"policy/{policy}/training/rollout_probs_diff_mean"] < 1e-5  # trained on the ids and log-probs it sampled
    assert data["mas/program/runs_mean"] > 2 and data["mas/program/replayed_calls"] > 0 and data["mas/episode_errors"] == 0
    assert "mas/tool/reward_mean" in data and "mas/plan/reward_mean" in data
    rows = dumped_rows(dump)
    assert {(row["mas_role"], tuple(row["mas_served_by"])) for row in rows} == {("tool", ("tool_policy",)), ("plan", ("plan_policy",))}
    groups = defaultdict(list)
    for row in rows:
        groups[row["mas_group"]].append(row)
    assert set(Counter(len(g) for g in groups.values())) == {2}  # every node: K = 2 replies
    for group in groups.values():
        assert len({(row["mas_role"], row["mas_turn"], row["mas_node"]) for row in group}) == 1
        assert sum(row["mas_chosen"] for row in group) == 1

    # pettingllms-eval plays the trained team, written with the bare openai client, as trained and with
    # the two policies swapped; the viewer shows its calls per agent
    out = artifacts / "program_eval"
    checkpoints = artifacts / "checkpoints" / "plan_path_program_cpu"
    result = launch.run(
        [sys.executable, "-m", "pettingllms_verl.eval", f"team=plan_path_program_cpu@{checkpoints}", "--select", "latest",
         "--split", "val", "--episodes", "2", "--out", str(out), "--recipes", RECIPES, "--set", program("plan_path_openai"),
         "--set", "+pettingllms.policies.plan_policy.adapter.rank=8"],
        timeout=1200, cwd=artifacts, env={**os.environ, "PETTINGLLMS_ARTIFACTS": str(artifacts)},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = {row["swapped"]: row for row in json.load(open(out / "results.json"))["rows"]}
    assert set(rows) == {False, True} and rows[True]["swap"] == ["plan_policy", "tool_policy"]
    assert rows[False]["method"] == "program (per-role policies, mixed)" and all(row["episodes"] == 2 for row in rows.values())
    episodes = [json.loads(line) for line in open(out / "episodes.jsonl")]
    assert len(episodes) == 4 and all(e["workflow"] == "program" and e["program"]["runs"] == 1 for e in episodes)
    for episode in episodes:
        served = {"tool": ["tool_policy"], "plan": ["plan_policy"]}
        assert episode["served_by"] == (served if not episode["swapped"] else {"tool": ["plan_policy"], "plan": ["tool_policy"]})
        assert [s["role"] for s in episode["samples"]][:2] == ["tool", "plan"]
    page = out / "episodes.html"
    assert launch.run([sys.executable, "-m", "pettingllms_verl.eval.viewer", str(out / "episodes.jsonl"), "--out", str(page)]).returncode == 0
    shown = page.read_text()
    assert "<th>tool (tool_policy)</th><th>plan (plan_policy)</th>" in shown  # a column per agent, with its policy
    assert all(html.escape(s["reply"]) in shown for e in episodes for s in e["samples"])  # every call's reply, escaped


def test_a_langgraph_math_program_on_one_shared_policy_with_independent_runs(artifacts):
    """L0: one policy for the solver and the verifier (the LangGraph math team, the warm-started
    Plan-Path model: its tokenizer is math's); rollout.n = 2 independent runs per problem, grouped by
    (problem, call number, agent); validation plays each val problem once and reports success."""
    write_math_fixture(artifacts)
    dump = artifacts / "program_l0_batches"
    metrics = run_recipe(
        artifacts, "math_program_cpu", program("math_solver_verifier"), f"actor_rollout_ref.model.path={artifacts / 'tiny_model_plan_path'}",
        "trainer.total_training_steps=1", "trainer.experiment_name=program_l0",
        "~pettingllms.policies", "~pettingllms.roles.solver.policy", "~pettingllms.roles.verifier.policy",  # none listed: one policy, shared
        "pettingllms.rollout_mode=independent", "actor_rollout_ref.rollout.n=2", "trainer.test_freq=1",
        f"pettingllms.paths.batch_dump_dir={dump}",
    )
    data = metrics[-1]["data"]
    assert data["policy/shared/rows"] > 0 and data["mas/program/runs_mean"] == 1.0 and data["mas/episode_errors"] == 0
    assert any(key.startswith("val-core/math/") for key in data)
    rows = dumped_rows(dump)
    assert {row["mas_role"] for row in rows} == {"solver", "verifier"} and {row["mas_policy"] for row in rows} == {"shared"}
    groups = defaultdict(list)
    for row in rows:
        groups[row["mas_group"]].append(row)
    assert all(len({(r["mas_role"], r["mas_turn"]) for r in g}) == 1 for g in groups.values())
    assert max(len(g) for g in groups.values()) == 2  # the two runs of a problem meet in their calls' groups


def test_an_autogen_team_in_its_own_environment_trains_an_adapter_per_agent_with_tree_sampling_by_replay(artifacts):
    """L1: the AutoGen AgentChat team, a command run by .venv-autogen's Python (AutoGen pins protobuf 5,
    verl's stack needs 6), each run a process of its own, each agent's calls served and trained by
    its own LoRA adapter on one base; K = 2 branches per call, each a replay of the command with the
    chosen prefix's replies served from the cache."""
    dump = artifacts / "autogen_batches"
    metrics = run_recipe(
        artifacts, "plan_path_program_cpu", "~pettingllms.program.target",
        f"+pettingllms.program.command=[{','.join(map(os.path.abspath, example_program('plan_path_autogen').command))}]",
        "+pettingllms.policies.tool_policy.adapter.rank=8", "+pettingllms.policies.plan_policy.adapter.rank=8",
        "trainer.total_training_steps=1", "trainer.experiment_name=autogen_l1", f"pettingllms.paths.batch_dump_dir={dump}",
    )
    data = metrics[0]["data"]
    assert data["mas/program/replayed_calls"] > 0 and data["mas/program/replay_diverged"] == 0 and data["mas/episode_errors"] == 0
    for policy in ("tool_policy", "plan_policy"):
        assert data[f"policy/{policy}/rows"] > 0 and f"policy/{policy}/actor/grad_norm" in data
        assert data[f"policy/{policy}/training/rollout_probs_diff_mean"] < 1e-5
    rows = dumped_rows(dump)
    assert {(row["mas_role"], tuple(row["mas_served_by"])) for row in rows} == {("tool", ("tool_policy",)), ("plan", ("plan_policy",))}
    groups = defaultdict(list)
    for row in rows:
        groups[row["mas_group"]].append(row)
    assert set(Counter(len(g) for g in groups.values())) == {2}  # every node: K = 2 replies, one of them continued
    assert all(sum(row["mas_chosen"] for row in group) == 1 for group in groups.values())
