"""L1 on vLLM: a LoRA adapter per role in one vLLM server (`vllm_multilora`, vLLM's CPU build)
through `python -m verl.trainer.main_ppo`: each request served by its role's adapter, only the
trainable adapter re-sent after a step, the rollout's log-probs those of the actor's adapters."""

import pytest

from vllm_runs import PROB_GAP, STEPS, assert_served_by_own_policy, train, weight_versions

RECIPE = "plan_path_mas_lora_vllm_cpu"
POLICY_OF = {"tool": "tool_adapter", "plan": "plan_adapter"}  # tool_adapter is frozen in the recipe


@pytest.fixture(scope="module")
def run(plan_path_artifacts):
    return train(plan_path_artifacts, RECIPE)


def test_three_steps_train_the_trainable_adapter_only(run):
    metrics, _, _ = run
    assert len(metrics) == STEPS
    for data in metrics:
        assert data["policy/plan_adapter/rows"] > 0 and data["policy/tool_adapter/rows"] > 0
        assert "policy/plan_adapter/actor/grad_norm" in data and "policy/tool_adapter/actor/grad_norm" not in data
    assert any(data["policy/plan_adapter/actor/grad_norm"] > 0 for data in metrics[:-1])


def test_every_request_was_served_by_its_roles_adapter(run):
    # mas_served_by: the adapter MultiLoRAHttpServer.generate names on its reply
    assert_served_by_own_policy(run[1], POLICY_OF)


def test_only_the_trainable_adapter_is_sent_again_after_a_step(run):
    metrics, rows, _ = run
    # the server's version of each adapter: the frozen one sent once (before step 1), the trained one after every step
    assert weight_versions(rows, "tool") == {(0,)}
    assert weight_versions(rows, "plan") == {(step,) for step in range(STEPS)}
    for step, data in enumerate(metrics, start=1):
        for adapter in POLICY_OF.values():  # each adapter served with the weights the actor scores with
            assert data[f"policy/{adapter}/training/rollout_probs_diff_max"] < PROB_GAP, (step, adapter)
