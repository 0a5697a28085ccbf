"""PPO with a critic per policy (``algorithm.adv_estimator=gae``, docs/training.md) through
`python -m verl.trainer.main_ppo` on CPU: a model per role (L2, plan_path_mas_full_cpu), so both
paths that build a critic run, verl's own for the first policy (the one an L0 run has) and this
package's for the other. Checked on what the run logged and saved: each critic learns, every
critic is saved and comes back on resume, a frozen policy gets none."""

import pytest
import torch

from support.checkpoints import saved_policy
from support.runs import K_MINI_BATCHES, run_recipe

pytestmark = pytest.mark.slow
POLICIES = ("tool_policy", "plan_policy")
STEPS = 4
# A fixed setting: the same two problems every step (unshuffled), greedy replies (top_k=1) so that
# every step plays the same rows, and the actors waiting (verl's critic_warmup) while the critics fit them.
FIXED = ("algorithm.adv_estimator=gae", "data.train_max_samples=2", "data.shuffle=false",
         "+pettingllms.roles.tool.sampling.top_k=1", "+pettingllms.roles.plan.sampling.top_k=1")


@pytest.fixture(scope="module")
def learnt(artifacts):
    metrics = run_recipe(artifacts, "plan_path_mas_full_cpu", *FIXED, f"trainer.total_training_steps={STEPS}",
                         "trainer.critic_warmup=100", f"trainer.default_local_dir={artifacts / 'checkpoints'}")
    return [m["data"] for m in metrics]


def test_each_policys_critic_learns_the_returns_of_a_fixed_setting(learnt):
    assert len(learnt) == STEPS
    assert len({round(step["critic/returns/mean"], 6) for step in learnt}) == 1  # the same rows every step
    for policy in POLICIES:
        loss = [step[f"policy/{policy}/critic/vf_loss"] for step in learnt]
        explained = [step[f"policy/{policy}/critic/vf_explained_var"] for step in learnt]
        assert loss[-1] < loss[0] / 2, loss
        assert explained[-1] > explained[0] + 0.2, explained
        assert all(f"policy/{policy}/actor/grad_norm" not in step for step in learnt)  # the actors waited
    whole = [step["critic/vf_explained_var"] for step in learnt]  # verl's, over both policies' rows
    assert whole[-1] > whole[0] + 0.5, whole


def test_every_critic_is_saved_and_resumed_and_a_frozen_policy_gets_none(artifacts, learnt):
    """Resumed with the first policy frozen: verl's critic (the first policy's) is left unused, the
    other policy's critic comes back from its checkpoint and trains on."""
    checkpoints = artifacts / "checkpoints"
    for policy in POLICIES:  # each critic's update: K optimizer steps per training step
        assert saved_policy(checkpoints / f"global_step_{STEPS}", policy, "critics")[1] == {STEPS * K_MINI_BATCHES}
    resumed = run_recipe(artifacts, "plan_path_mas_full_cpu", *FIXED, f"trainer.total_training_steps={STEPS + 1}",
                         "+pettingllms.policies.tool_policy.trainable=false", f"trainer.default_local_dir={checkpoints}")
    assert [m["step"] for m in resumed] == [STEPS + 1]
    step = resumed[0]["data"]
    last = checkpoints / f"global_step_{STEPS + 1}"
    # the plan policy's critic came back: its optimizer's step count went on, and its loss is the fitted one
    assert saved_policy(last, "plan_policy", "critics")[1] == {(STEPS + 1) * K_MINI_BATCHES}
    assert step["policy/plan_policy/critic/vf_loss"] < learnt[0]["policy/plan_policy/critic/vf_loss"] / 2
    assert step["policy/plan_policy/actor/grad_norm"] > 0  # its actor trained on the critic's advantages
    # the frozen tool policy: no critic read, updated or saved, and its actor's weights as they were
    assert not any(key.startswith("policy/tool_policy/critic/") for key in step)
    assert not (last / "critics" / "tool_policy").exists()
    before, _ = saved_policy(checkpoints / f"global_step_{STEPS}", "tool_policy")
    after, _ = saved_policy(last, "tool_policy")
    assert all(torch.equal(before[name], after[name]) for name in before)
