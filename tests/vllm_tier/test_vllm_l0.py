"""L0 on vLLM: the MAS AT-GRPO recipe through `python -m verl.trainer.main_ppo` with verl's own vLLM
server (vLLM's CPU build), checked on what reached the trainer: weights synced into vLLM before
every rollout, the rollout's log-probs those of the actor, validation through the same server."""

import re

import pytest

from vllm_runs import PROB_GAP, STEPS, train

RECIPE = "plan_path_mas_atgrpo_vllm_cpu"


@pytest.fixture(scope="module")
def run(plan_path_artifacts):
    # lr 1e-3: steps large enough that a missed sync shows; one validation pass after the last step
    return train(plan_path_artifacts, RECIPE, f"trainer.test_freq={STEPS}", "actor_rollout_ref.actor.optim.lr=1e-3")


def test_three_steps_train_with_mas_metrics(run):
    metrics, rows, _ = run
    assert len(metrics) == STEPS
    for data in metrics:
        for key in ("mas/success", "mas/tool/reward_mean", "mas/plan/reward_mean", "at_grpo/num_groups"):
            assert key in data, key
    assert any(data["actor/grad_norm"] > 0 for data in metrics[:-1])  # the weights changed between rollouts
    assert {row["mas_role"] for row in rows} == {"tool", "plan"}


def test_weights_reach_vllm_before_every_rollout(run):
    metrics, _, _ = run
    for step, data in enumerate(metrics, start=1):
        # the rollout sampled from the weights the actor scores with: synced after every update
        assert data["training/rollout_probs_diff_max"] < PROB_GAP, (step, data["training/rollout_probs_diff_max"])
        # and the server says so: every reply came from the weights of this step (staleness 0)
        assert data["training/off_policy/trajectory_staleness/max"] == 0, step


def test_validation_runs_through_the_same_server(run):
    metrics, _, _ = run
    assert 0.0 <= metrics[-1]["val-core/plan_path/reward/mean@1"] <= 1.0


def test_the_engine_runs_with_prefix_caching_and_without_sleep_mode(run):
    _, _, output = run
    assert "--enable_prefix_caching" in output  # the arguments verl's server hands to vLLM
    assert "--enable_sleep_mode" not in output
    # the engine starts on dummy weights: the rollout's weights are the trainer's sync, from the first step on
    assert re.search(r"'--load_format',\n[^\n]*'dummy'", output)
