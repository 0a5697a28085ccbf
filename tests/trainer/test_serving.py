"""``MASTrainer._serving``: verl's per-batch methods pointed at one policy's worker group, config and
tokenizer (a team of several model families pads each policy's batch with its own tokens), and the
trainer's own restored after, even when the batch fails."""

from types import SimpleNamespace

import pytest

from pettingllms_verl.trainer.mas_trainer import MASTrainer
from pettingllms_verl.trainer.policies import PolicyGroup


def trainer() -> SimpleNamespace:
    return SimpleNamespace(actor_rollout_wg="verl's actor", ref_policy_wg="verl's ref", critic_wg="verl's critic", config="verl's config",
                           tokenizer="first family", use_reference_policy=True)


def group(tokenizer) -> PolicyGroup:
    return PolicyGroup("other", True, "its config", "its workers", servers=None, sync=None, critic="its critic", tokenizer=tokenizer)


def test_a_policy_of_another_family_is_served_with_its_own_tokenizer_and_the_trainers_comes_back():
    own = trainer()
    with MASTrainer._serving(own, group("second family")):
        assert (own.actor_rollout_wg, own.ref_policy_wg, own.critic_wg, own.config, own.tokenizer) == (
            "its workers", "its workers", "its critic", "its config", "second family")
    assert (own.actor_rollout_wg, own.ref_policy_wg, own.critic_wg, own.config, own.tokenizer) == (
        "verl's actor", "verl's ref", "verl's critic", "verl's config", "first family")
    with pytest.raises(RuntimeError), MASTrainer._serving(own, group("second family")):
        raise RuntimeError("a batch failed")
    assert own.tokenizer == "first family" and own.actor_rollout_wg == "verl's actor"
    with MASTrainer._serving(own, group(None)):  # verl's own group: the trainer's tokenizer
        assert own.tokenizer == "first family"
