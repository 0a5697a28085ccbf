"""L2 on vLLM: a full model per role, each with its own FSDP actor and its own vLLM server (named
by the policy), through `python -m verl.trainer.main_ppo` on vLLM's CPU build: each policy's weights
synced into its own server after every step."""

import pytest

from vllm_runs import PROB_GAP, STEPS, assert_served_by_own_policy, train, weight_versions

RECIPE = "plan_path_mas_full_vllm_cpu"
POLICY_OF = {"tool": "tool_policy", "plan": "plan_policy"}


@pytest.fixture(scope="module")
def run(plan_path_artifacts):
    return train(plan_path_artifacts, RECIPE)


def test_three_steps_train_both_policies(run):
    metrics, _, _ = run
    assert len(metrics) == STEPS
    for policy in POLICY_OF.values():
        assert all(data[f"policy/{policy}/rows"] > 0 for data in metrics)
        assert any(data[f"policy/{policy}/actor/grad_norm"] > 0 for data in metrics[:-1])


def test_each_policy_has_its_own_server(run):
    # two servers answer, each naming the one policy it serves
    assert_served_by_own_policy(run[1], POLICY_OF)


def test_each_policys_weights_reach_its_server_after_every_step(run):
    metrics, rows, _ = run
    for role in POLICY_OF:
        assert weight_versions(rows, role) == {(step,) for step in range(STEPS)}
    for step, data in enumerate(metrics, start=1):
        for policy in POLICY_OF.values():
            assert data[f"policy/{policy}/training/rollout_probs_diff_max"] < PROB_GAP, (step, policy)
