"""The asynchronous trainer's bookkeeping, without a launch: which replies a step may train on
(``MASTrainer._check_versions``), and which a policy's own bound leaves untrained (``_leave_untrained``). The schedule itself runs through ``main_ppo`` in
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


def test_a_policys_own_bound_leaves_its_older_replies_untrained_in_their_groups(monkeypatch):
    """``pettingllms.policies.<name>.max_staleness``: at step 5 with bound 0, rows whose oldest reply
    came from weights 3 or 2 (one and two pushes behind) get a zero response mask, as a placeholder's
    (their groups' advantages stay as computed); fresh rows, placeholders and padding rows keep theirs."""
    import torch

    from pettingllms_verl.trainer import mas_trainer

    masks = {key: torch.ones(3, dtype=torch.int64) for key in ("fresh", "one", "two", "placeholder", "padding")}
    loss_masks = dict(masks)  # verl's loss mask, a copy of the response mask: the loss is a mean over its tokens

    def get(keys, partition_id, select_fields):
        assert select_fields == ["response_mask"]
        return {"response_mask": torch.stack([masks[key] for key in keys])}

    def put(keys, partition_id, fields):
        for index, key in enumerate(keys):
            masks[key], loss_masks[key] = fields["response_mask"][index], fields["loss_mask"][index]

    monkeypatch.setattr(mas_trainer.tq, "kv_batch_get", get)
    monkeypatch.setattr(mas_trainer.tq, "kv_batch_put", put)
    tags = {"fresh": {"mas_weight_versions": [4]}, "one": {"mas_weight_versions": [3, 4]}, "two": {"mas_weight_versions": [2]},
            "placeholder": {"mas_placeholder": True, "mas_weight_versions": [1]}}  # "padding": verl's copy of a row, no tags of its own
    part = SimpleNamespace(keys=list(masks), partition_id="train")
    colocated = trainer(MASColocateAsyncTrainer, step=5)
    assert colocated._leave_untrained(part, tags, bound=1) == (1, 3)  # (rows left untrained, rows with a reply)
    assert [key for key, mask in masks.items() if not mask.any()] == [key for key, mask in loss_masks.items() if not mask.any()] == ["two"]
    assert colocated._leave_untrained(part, tags, bound=0) == (2, 3)
    assert {key for key, mask in masks.items() if not mask.any()} == {key for key, mask in loss_masks.items() if not mask.any()} == {"one", "two"}
    assert masks["fresh"].tolist() == masks["placeholder"].tolist() == masks["padding"].tolist() == loss_masks["fresh"].tolist() == [1, 1, 1]
