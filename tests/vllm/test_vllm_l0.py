"""L0 on vLLM: the MAS AT-GRPO recipe through `python -m verl.trainer.main_ppo` with verl's own vLLM
server (vLLM's CPU build), checked on what reached the trainer: weights synced into vLLM before
every rollout, the rollout's log-probs those of the actor, validation through the same server."""

import json
import os
import re

import pytest

import launch

RECIPES = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "recipes"))
RECIPE = "plan_path_mas_atgrpo_vllm_cpu"
STEPS = 3
# fp32 on both sides, different kernels (vLLM's CPU attention and GEMMs against torch's): a gap of
# ~1e-9 in probability is rounding; an unsynced step would show the actor's own update, ~1e-3 and up
PROB_GAP = 1e-5


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory, warm_model):
    from pettingllms_verl.data.rows import write_parquet
    from pettingllms_verl.envs.splits import generate_splits

    root = tmp_path_factory.mktemp("vllm_l0")
    warm_model("plan_path", root / "tiny_model_plan_path")  # well-formed replies: rewards differ, weights move
    splits = generate_splits("plan_path", {"train": 32, "val": 4}, {"size": 6})
    for split, rows in splits.items():
        write_parquet(rows, str(root / "data" / "plan_path_6x6" / f"{split}.parquet"))
    return root


@pytest.fixture(scope="module")
def run(artifacts):
    metrics_path = artifacts / "metrics.jsonl"
    result = launch.main_ppo(
        "--config-path", RECIPES, "--config-name", RECIPE,
        f"trainer.total_training_steps={STEPS}", f"trainer.test_freq={STEPS}",
        "actor_rollout_ref.actor.optim.lr=1e-3",  # steps large enough that a missed sync shows
        timeout=1200, cwd=artifacts,
        env={**os.environ, "PETTINGLLMS_ARTIFACTS": str(artifacts), "VERL_FILE_LOGGER_PATH": str(metrics_path)},
    )
    assert result.returncode == 0, (result.stdout[-4000:], result.stderr[-4000:])
    metrics = [json.loads(line)["data"] for line in open(metrics_path)]
    return metrics, result.stdout + result.stderr


def test_three_steps_train_with_mas_metrics(run):
    metrics, _ = run
    assert len(metrics) == STEPS
    for data in metrics:
        for key in ("mas/success", "mas/tool/reward_mean", "mas/plan/reward_mean", "at_grpo/num_groups"):
            assert key in data, key
    assert any(data["actor/grad_norm"] > 0 for data in metrics[:-1])  # the weights changed between rollouts


def test_weights_reach_vllm_before_every_rollout(run):
    metrics, _ = run
    for step, data in enumerate(metrics, start=1):
        # the rollout sampled from the weights the actor scores with: synced after every update
        assert data["training/rollout_probs_diff_max"] < PROB_GAP, (step, data["training/rollout_probs_diff_max"])
        # and the server says so: every reply came from the weights of this step (staleness 0)
        assert data["training/off_policy/trajectory_staleness/max"] == 0, step


def test_validation_runs_through_the_same_server(run):
    metrics, _ = run
    assert 0.0 <= metrics[-1]["val-core/plan_path/reward/mean@1"] <= 1.0


def test_the_engine_runs_with_prefix_caching_and_without_sleep_mode(run):
    _, output = run
    assert "--enable_prefix_caching" in output  # the arguments verl's server hands to vLLM
    assert "--enable_sleep_mode" not in output
    # the engine starts on dummy weights: the rollout's weights are the trainer's sync, from the first step on
    assert re.search(r"'--load_format',\n[^\n]*'dummy'", output)
