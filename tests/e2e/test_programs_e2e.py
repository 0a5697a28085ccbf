"""Team programs trained through ``main_ppo``, their calls served through the gateway by the
rollout's servers and trained with AT-GRPO, at each policy level (L0 one shared policy, L1 a LoRA
adapter per agent, L2 a model per agent): the four Plan-Path examples (the bare ``openai`` client,
LangGraph, the OpenAI Agents SDK, AutoGen AgentChat as a command in an environment of its own) in
one launch per level, each playing one of the step's problems (``plan_path_frameworks.py``); the L2
checkpoint evaluated as the bare ``openai`` client's team; and the LangGraph math team (a solver and
a verifier, ``math_solver_verifier.py``) at each level."""

import html
import json
import os
import sys
from collections import Counter, defaultdict

import pytest

from support import RECIPES, SUPPORT, launch, plan_path_frameworks
from support.runs import dumped_rows, run_recipe, write_math_fixture

pytestmark = pytest.mark.slow



def program(example: str) -> str:
    """The override that plays ``examples/agents/<example>.py`` (an absolute path: the tests start main_ppo in their artifacts folder)."""
    return f"pettingllms.program.target={os.path.abspath(os.path.join(plan_path_frameworks.EXAMPLES, example))}.py:team"


LEVELS = {  # level -> (overrides of plan_path_program_cpu, each agent's policy)
    "L0": (["~pettingllms.policies", "~pettingllms.roles.tool.policy", "~pettingllms.roles.plan.policy"], {"tool": "shared", "plan": "shared"}),
    "L1": (["+pettingllms.policies.tool_policy.adapter.rank=8", "+pettingllms.policies.plan_policy.adapter.rank=8"],
           {"tool": "tool_policy", "plan": "plan_policy"}),
    "L2": ([], {"tool": "tool_policy", "plan": "plan_policy"}),
}


def assert_trained_by_replay(data: dict, dump, served: dict[str, str]) -> None:
    """A one-step program run with K = 2 tree sampling by replay (its step metrics ``data``, its rows
    dumped to ``dump``): each agent's calls served and trained by its policy in ``served`` (agent ->
    policy), every policy updated on the ids and log-probs it sampled, every tree node a group of
    K = 2 replies to one prompt with one of them continued."""
    for policy in set(served.values()):
        assert data[f"policy/{policy}/rows"] > 0 and f"policy/{policy}/actor/grad_norm" in data
        assert data[f"policy/{policy}/training/rollout_probs_diff_mean"] < 1e-5  # trained on the ids and log-probs it sampled
    assert data["mas/program/replayed_calls"] > 0 and data["mas/program/replay_diverged"] == 0 and data["mas/episode_errors"] == 0
    rows = dumped_rows(dump)
    assert {(row["mas_role"], tuple(row["mas_served_by"])) for row in rows} == {(agent, (policy,)) for agent, policy in served.items()}
    groups = defaultdict(list)
    for row in rows:
        groups[row["mas_group"]].append(row)
    assert set(Counter(len(g) for g in groups.values())) == {2}  # every node: K = 2 replies, one of them continued
    for group in groups.values():
        assert len({(row["mas_role"], row["mas_turn"], row["mas_node"]) for row in group}) == 1
        assert sum(row["mas_chosen"] for row in group) == 1


def train_every_framework(artifacts, level: str) -> list[dict]:
    """One step of ``plan_path_program_cpu`` at ``level`` with ``plan_path_frameworks.py``: the four
    problems of the step (seeds 0-3, in order) played by the four example programs, one each; K = 2
    branches per call, replayed. Asserts what holds at every level; returns the episode log."""
    overrides, served = LEVELS[level]
    dump, episodes = artifacts / f"frameworks_{level}_batches", artifacts / f"frameworks_{level}_episodes"
    metrics = run_recipe(
        artifacts, "plan_path_program_cpu", f"pettingllms.program.target={SUPPORT / 'plan_path_frameworks.py'}:team", *overrides,
        "trainer.total_training_steps=1", "data.train_batch_size=4", "data.shuffle=False", f"trainer.experiment_name=frameworks_{level}",
        f"pettingllms.paths.batch_dump_dir={dump}", f"pettingllms.paths.episode_log_dir={episodes}",
    )
    assert_trained_by_replay(metrics[0]["data"], dump, served)
    assert "mas/tool/reward_mean" in metrics[0]["data"] and "mas/plan/reward_mean" in metrics[0]["data"]
    played = [json.loads(line) for name in os.listdir(episodes) for line in open(episodes / name)]
    by_framework = defaultdict(list)
    for episode in played:
        by_framework[plan_path_frameworks.framework(episode["seed"])].append(episode)
    assert set(by_framework) == set(plan_path_frameworks.FRAMEWORKS)  # each framework played its problem
    for framework, runs in by_framework.items():
        for episode in runs:
            assert episode["error"] is None and episode["program"]["runs"] > 1, (framework, episode["error"])  # replayed to branch
            assert {s["role"]: s["policy"] for s in episode["samples"]} == served, framework  # each agent's calls reached its policy
    return played


def test_every_framework_trains_on_one_shared_policy(artifacts):
    """L0: the four Plan-Path programs' agents all served and trained by one policy."""
    train_every_framework(artifacts, "L0")


def test_every_framework_trains_an_adapter_per_agent(artifacts):
    """L1: each agent's calls served and trained by its own LoRA adapter on one base, in every framework."""
    train_every_framework(artifacts, "L1")


def test_every_framework_trains_a_model_per_agent_and_is_evaluated_as_trained_and_swapped(artifacts):
    """L2: each agent a full model of its own, in every framework. Then ``pettingllms-eval`` plays
    the checkpoint with the bare ``openai`` client's team, as trained and with the two policies
    swapped; the viewer shows its calls per agent."""
    train_every_framework(artifacts, "L2")
    out = artifacts / "program_eval"
    checkpoints = artifacts / "checkpoints" / "frameworks_L2"
    result = launch.run(
        [sys.executable, "-m", "pettingllms_verl.eval", f"team=plan_path_program_cpu@{checkpoints}", "--select", "latest",
         "--split", "val", "--episodes", "2", "--out", str(out), "--recipes", RECIPES, "--set", program("plan_path_openai")],
        timeout=1200, cwd=artifacts, env={**os.environ, "PETTINGLLMS_ARTIFACTS": str(artifacts)},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = {row["swapped"]: row for row in json.load(open(out / "results.json"))["rows"]}
    assert set(rows) == {False, True} and rows[True]["swap"] == ["plan_policy", "tool_policy"]
    assert rows[False]["method"] == "program (per-role policies, full models)" and all(row["episodes"] == 2 for row in rows.values())
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


@pytest.mark.parametrize("level", ["L1", "L2"])
def test_the_langgraph_math_team_trains_a_policy_per_agent_with_tree_sampling_by_replay(artifacts, level):
    """L1 (a LoRA adapter per agent on one base) and L2 (a model per agent, the recipe as shipped):
    the solver's and the verifier's calls each reach their own policy, K = 2 branches per call by
    replay, and both policies are updated on the ids and log-probs they sampled. In L2 the verifier
    is a model of another tokenizer family (``models.tiny --family bracket``): each agent's calls are
    rendered in its own policy's chat template."""
    write_math_fixture(artifacts)
    dump, log = artifacts / f"math_{level}_batches", artifacts / f"math_{level}_episodes"
    if level == "L1":
        policies = ["+pettingllms.policies.solver_policy.adapter.rank=8", "+pettingllms.policies.verifier_policy.adapter.rank=8"]
    else:
        from pettingllms_verl.models.tiny import build

        bracket = build(str(artifacts / "tiny_model_bracket"), seed=0, family="bracket")
        policies = [f"+pettingllms.policies.verifier_policy.overrides.model.path={bracket}", f"pettingllms.paths.episode_log_dir={log}"]
    metrics = run_recipe(
        artifacts, "math_program_cpu", program("math_solver_verifier"), f"actor_rollout_ref.model.path={artifacts / 'tiny_model_plan_path'}",
        *policies, "trainer.total_training_steps=1", f"trainer.experiment_name=math_{level}", f"pettingllms.paths.batch_dump_dir={dump}",
    )
    assert_trained_by_replay(metrics[0]["data"], dump, {"solver": "solver_policy", "verifier": "verifier_policy"})
    if level == "L2":
        samples = [sample for name in os.listdir(log) for line in open(log / name) for sample in json.loads(line)["samples"]]
        prompts = {role: [s["prompt"] for s in samples if s["role"] == role] for role in ("solver", "verifier")}
        assert prompts["solver"] and all(p.startswith("<|im_start|>") for p in prompts["solver"])
        assert prompts["verifier"] and all(p.startswith("<s>[") and "<|im_start|>" not in p for p in prompts["verifier"])
