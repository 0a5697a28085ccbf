"""L1 on vLLM, asynchronously: a LoRA adapter per role in one vLLM server (`vllm_multilora`, vLLM's
CPU build) through `python -m verl.trainer.main_ppo` under ``mas_colocate_async``: each request
served with its role's adapter (the rollout's token probabilities are those of the actor with that
adapter, and both adapters are far from the base), only the trainable adapter re-sent after a
step, every reply within verl's staleness bound and every group whole."""

import pytest

from support.asynchronous import ASYNC, assert_trained_asynchronously_within_bounds, rows_by_step
from vllm_runs import PROB_GAP, STEPS, assert_served_by_own_policy, train, weight_versions

RECIPE = "plan_path_mas_lora_vllm_cpu"
POLICY_OF = {"tool": "tool_adapter", "plan": "plan_adapter"}  # tool_adapter is frozen in the recipe


@pytest.fixture(scope="module")
def run(plan_path_artifacts):
    # the frozen adapter starts from random, non-zero weights (a zero lora_B would serve the base's
    # replies, and a request served without its adapter would look the same); the trained one moves off zero
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    frozen = plan_path_artifacts / "tool_adapter_start"
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(plan_path_artifacts / "tiny_model_plan_path")
    get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", init_lora_weights=False)).save_pretrained(frozen)
    return train(plan_path_artifacts, RECIPE, f"+pettingllms.policies.tool_adapter.adapter.path={frozen}", *ASYNC)


def test_three_steps_train_the_trainable_adapter_only_within_the_staleness_bound(run, plan_path_artifacts):
    metrics, _, _ = run
    assert len(metrics) == STEPS
    for data in metrics:
        assert data["policy/plan_adapter/rows"] > 0 and data["policy/tool_adapter/rows"] > 0
        assert "policy/plan_adapter/actor/grad_norm" in data and "policy/tool_adapter/actor/grad_norm" not in data
    assert any(data["policy/plan_adapter/actor/grad_norm"] > 0 for data in metrics[:-1])
    steps = [{"step": step, "data": data} for step, data in enumerate(metrics, start=1)]
    assert_trained_asynchronously_within_bounds(steps, rows_by_step(plan_path_artifacts / f"{RECIPE}_batches"), ("plan_adapter",))


def test_every_request_was_served_by_its_roles_adapter(run):
    # mas_served_by: the adapter MultiLoRAHttpServer.generate names on its reply
    assert_served_by_own_policy(run[1], POLICY_OF)


def test_only_the_trainable_adapter_is_sent_again_after_a_step(run):
    metrics, rows, _ = run
    # the server's version of each adapter: the frozen one sent once (before step 1), the trained one after every step
    assert weight_versions(rows, "tool") == {(0,)}
    plan_versions = {version for versions in weight_versions(rows, "plan") for version in versions}
    assert plan_versions <= set(range(STEPS)) and max(plan_versions) >= 1  # re-sent after a step, and served
    assert metrics[0]["policy/plan_adapter/training/rollout_probs_diff_max"] < PROB_GAP  # step 1: nothing pushed yet
    for step, data in enumerate(metrics, start=1):  # the frozen adapter: served with the weights the actor scores with, at every step
        assert data["policy/tool_adapter/training/rollout_probs_diff_max"] < PROB_GAP, step
