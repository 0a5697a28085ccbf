"""The asynchronous trainer's bookkeeping, without a launch: which replies a step may train on
(``MASTrainer._check_versions``). The schedule itself runs through ``main_ppo`` in
``tests/e2e/test_async_e2e.py``."""

from types import SimpleNamespace

import pytest

from pettingllms_verl.trainer.mas_async import MASColocateAsyncTrainer
from pettingllms_verl.trainer.mas_trainer import MASTrainer


def trainer(cls, step: int, threshold: int | None = 2, strategy: str = "drop"):
    t = object.__new__(cls)
    t.global_steps = step
    t.replay_buffer = SimpleNamespace(max_off_policy_threshold=threshold, max_off_policy_strategy=strategy)
    return t


def test_the_synchronous_trainer_takes_only_replies_of_the_weights_it_trains():
    sync = trainer(MASTrainer, step=5)
    assert sync.trainer_mode == "sync"
    sync._check_versions("row", "p", [4])
    for versions in ([3], [3, 4], []):
        with pytest.raises(AssertionError, match="off-policy rollout"):
            sync._check_versions("row", "p", versions)


def test_the_colocated_asynchronous_trainer_takes_older_replies_within_verls_staleness_bound():
    """threshold 2 (drop): a group is trained at most 2 steps after its prompt went out, when the
    weights were one push old: at step 5, versions 3 and 4, not 2, never a version from the future."""
    colocated = trainer(MASColocateAsyncTrainer, step=5)
    assert colocated.trainer_mode == "colocate_async"
    for versions in ([4], [3], [3, 4]):
        colocated._check_versions("row", "p", versions)
    for versions in ([2, 4], [5], []):
        with pytest.raises(AssertionError, match="max_off_policy_threshold=2"):
            colocated._check_versions("row", "p", versions)
    # verl's dropless "wait" and no threshold bound nothing: only a version from the future is refused
    for unbounded in (trainer(MASColocateAsyncTrainer, 5, strategy="wait"), trainer(MASColocateAsyncTrainer, 5, threshold=None)):
        unbounded._check_versions("row", "p", [0, 4])
        with pytest.raises(AssertionError):
            unbounded._check_versions("row", "p", [5])
