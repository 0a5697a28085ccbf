"""L2 on vLLM: a full model per role, each with its own FSDP actor and its own vLLM server (named
by the policy), through `python -m verl.trainer.main_ppo` on vLLM's CPU build: each policy's weights
synced into its own server after every step. The two models are of two tokenizer families (the plan
policy's: models/tiny.py's ``bracket``), so each server serves another vocabulary and template."""

import json
import os
import sys

import pytest

from support import launch
from vllm_runs import PROB_GAP, RECIPES, STEPS, assert_served_by_own_policy, train, weight_versions

RECIPE = "plan_path_mas_full_vllm_cpu"
POLICY_OF = {"tool": "tool_policy", "plan": "plan_policy"}
BRACKET = "tiny_model_plan_path_bracket"  # the plan policy's model: the tiny model of the second tokenizer family, warm-started


def on_the_second_family(root) -> str:
    """The override that gives the plan policy its model (in training and in evaluation)."""
    return f"+pettingllms.policies.plan_policy.overrides.model.path={root / BRACKET}"


@pytest.fixture(scope="module")
def run(plan_path_artifacts, warm_model):
    warm_model("plan_path", plan_path_artifacts / BRACKET, family="bracket")
    return train(
        plan_path_artifacts, RECIPE, f"trainer.test_freq={STEPS}",  # validated at the last step: eval picks it
        on_the_second_family(plan_path_artifacts), f"pettingllms.paths.episode_log_dir={plan_path_artifacts / 'episodes'}",
    )


def test_three_steps_train_both_policies(run):
    metrics, _, _ = run
    assert len(metrics) == STEPS
    for policy in POLICY_OF.values():
        assert all(data[f"policy/{policy}/rows"] > 0 for data in metrics)
        assert any(data[f"policy/{policy}/actor/grad_norm"] > 0 for data in metrics[:-1])


def test_each_policy_has_its_own_server_and_its_own_family(run, plan_path_artifacts):
    # two servers answer, each naming the one policy it serves
    assert_served_by_own_policy(run[1], POLICY_OF)
    # each role's prompts in its policy's template, its replies read in its vocabulary (the episode log decodes per role)
    log = plan_path_artifacts / "episodes"
    samples = [s for name in os.listdir(log) for line in open(log / name) for s in json.loads(line)["samples"] if not s.get("placeholder")]
    by_role = {role: [s for s in samples if s["role"] == role] for role in POLICY_OF}
    assert all(s["prompt"].startswith("<s>[SYSTEM] ") and "<|im_start|>" not in s["prompt"] for s in by_role["plan"])
    assert all(s["prompt"].startswith("<|im_start|>system") for s in by_role["tool"])
    assert any(s["parse_ok"] for s in by_role["plan"])  # the warm-started bracket model answers in format through vLLM


def test_each_policys_weights_reach_its_server_after_every_step(run):
    metrics, rows, _ = run
    for role in POLICY_OF:
        assert weight_versions(rows, role) == {(step,) for step in range(STEPS)}
    for step, data in enumerate(metrics, start=1):
        for policy in POLICY_OF.values():
            assert data[f"policy/{policy}/training/rollout_probs_diff_max"] < PROB_GAP, (step, policy)


def test_eval_plays_the_checkpoint_through_the_vllm_servers_as_trained_and_swapped(run, plan_path_artifacts):
    """``pettingllms-eval`` on the trained checkpoint: each policy's weights loaded into its own vLLM
    server, played as trained and swapped (each role answered by the other role's server, in that
    server's family: a mixed team is swapped only when ``--swap`` names the pair)."""
    checkpoints = plan_path_artifacts / "checkpoints" / RECIPE
    out = plan_path_artifacts / "eval"
    result = launch.run(
        [sys.executable, "-m", "pettingllms_verl.eval", f"l2={RECIPE}@{checkpoints}", "--episodes", "3", "--swap", "plan_policy,tool_policy",
         "--set", on_the_second_family(plan_path_artifacts), "--out", str(out), "--recipes", RECIPES],
        timeout=1200, cwd=plan_path_artifacts, env={**os.environ, "PETTINGLLMS_ARTIFACTS": str(plan_path_artifacts)},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = {row["swapped"]: row for row in json.load(open(out / "results.json"))["rows"]}
    assert rows[False]["step"] == STEPS and rows[True]["swap"] == ["plan_policy", "tool_policy"]
    assert all(row["episodes"] == 3 for row in rows.values())
    episodes = [json.loads(line) for line in open(out / "episodes.jsonl")]
    assert len(episodes) == 6
    other = {"tool": "plan", "plan": "tool"}
    for episode in episodes:
        served = {role: POLICY_OF[other[role] if episode["swapped"] else role] for role in POLICY_OF}
        assert episode["served_by"] == {role: [policy] for role, policy in served.items()}
        assert ("bracket" in episode["models"]["plan"]) != episode["swapped"]  # rendered in the family of the policy serving it
