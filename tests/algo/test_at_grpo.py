"""AT-GRPO estimator, grouping and verl registration."""

import importlib
import random
import statistics
import sys

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from verl import DataProto
from verl.trainer.config import AlgoConfig
from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, get_adv_estimator_fn
from verl.trainer.ppo.ray_trainer import compute_advantage

from pettingllms_verl.algo import (
    compute_at_grpo_advantage,
    group_ids,
    group_stats,
    register_at_grpo,
    zero_variance_frac,
)

EPS = 1e-6


def reference_advantage(scores, keys, norm, eps=EPS):
    """Plain-Python AT-GRPO: one scalar per row from a dict of groups."""
    groups = {}
    for i, key in enumerate(keys):
        groups.setdefault(key, []).append(i)
    out = [0.0] * len(keys)
    for rows in groups.values():
        vals = [scores[i] for i in rows]
        if len(vals) < 2 or len(set(vals)) == 1:
            continue
        mean, std = statistics.fmean(vals), statistics.stdev(vals)  # stdev: unbiased, as verl
        for i in rows:
            out[i] = (scores[i] - mean) / (std + eps) if norm else scores[i] - mean
    return out


def random_batch(seed, response_length=5):
    """Random groups of sizes 1..6 (singletons included), some with all scores equal."""
    rng = random.Random(seed)
    keys, rows = [], []
    for g in range(60):
        key = f"uid{rng.randrange(20)}|t{rng.randrange(3)}|role{g}|n{rng.randrange(2)}"
        size = rng.choice([1, 1, 2, 3, 4, 6])
        constant = rng.random() < 0.3
        base = [rng.choice([0.0, 0.5, 1.0]) for _ in range(response_length)]
        for _ in range(size):
            keys.append(key)
            rows.append(base if constant else [rng.choice([0.0, 0.5, 1.0]) for _ in range(response_length)])
    order = list(range(len(keys)))
    rng.shuffle(order)  # members of a group need not be contiguous
    keys = np.array([keys[i] for i in order], dtype=object)
    rewards = torch.tensor([rows[i] for i in order], dtype=torch.float32)
    mask = (torch.rand(rewards.shape, generator=torch.Generator().manual_seed(seed)) > 0.3).float()
    return rewards, mask, keys


@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_advantage_matches_reference(norm, seed):
    rewards, mask, keys = random_batch(seed)
    adv, ret = compute_at_grpo_advantage(rewards, mask, keys, epsilon=EPS, norm_adv_by_std_in_grpo=norm)
    expected = reference_advantage(rewards.sum(-1).tolist(), list(keys), norm)
    assert adv.shape == rewards.shape and adv.dtype == rewards.dtype
    torch.testing.assert_close(adv, torch.tensor(expected).unsqueeze(-1) * mask, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ret, adv)
    assert torch.all(adv[mask == 0] == 0)
    # the data must exercise the special cases, or the comparison above proves little
    sizes = {k: list(keys).count(k) for k in set(keys)}
    assert 1 in sizes.values() and any(v != 0 for v in expected)


def test_singleton_and_equal_score_groups_are_exactly_zero():
    # float64 0.1 * 3 / 3 != 0.1: a mean-based test would leave a residue that eps amplifies
    rewards = torch.tensor([[0.1], [0.1], [0.1], [5.0], [1.0], [2.0]], dtype=torch.float64)
    keys = ["a", "a", "a", "b", "c", "c"]
    for norm in (True, False):
        adv, _ = compute_at_grpo_advantage(rewards, torch.ones_like(rewards), keys, norm_adv_by_std_in_grpo=norm)
        assert adv[:4].eq(0).all()
        assert adv[4].item() < 0 < adv[5].item()


def test_config_overrides_arguments():
    rewards, mask, keys = random_batch(3)
    scores = rewards.sum(-1).tolist()
    adv, _ = compute_at_grpo_advantage(rewards, mask, keys, config=AlgoConfig(norm_adv_by_std_in_grpo=False))
    expected = torch.tensor(reference_advantage(scores, list(keys), norm=False)).unsqueeze(-1) * mask
    torch.testing.assert_close(adv, expected, rtol=1e-5, atol=1e-5)
    cfg = OmegaConf.create({"norm_adv_by_std_in_grpo": True, "epsilon": 10.0})
    adv, _ = compute_at_grpo_advantage(rewards, mask, keys, config=cfg)
    expected = torch.tensor(reference_advantage(scores, list(keys), norm=True, eps=10.0)).unsqueeze(-1) * mask
    torch.testing.assert_close(adv, expected, rtol=1e-5, atol=1e-5)


def test_empty_batch():
    adv, _ = compute_at_grpo_advantage(torch.zeros(0, 4), torch.zeros(0, 4), np.array([], dtype=object))
    assert adv.shape == (0, 4)


def test_index_length_mismatch_raises():
    with pytest.raises(ValueError, match="keys for"):
        compute_at_grpo_advantage(torch.zeros(3, 2), torch.ones(3, 2), ["a", "b"])


def assert_ids_match_equality(keys, ids):
    """Same id iff equal keys; ids dense in order of first appearance."""
    first = {}
    expected = [first.setdefault(k, len(first)) for k in keys]
    assert ids.dtype == torch.int64 and ids.tolist() == expected


def test_group_ids_never_merge_distinct_keys():
    # each pair collides under naive schemes: concatenation/arithmetic, int coercion, str()
    keys = ["1|t10", "11|t0", "1|t1", "11|t", "01", "1", 1, (1, "t10"), (11, "t0"), ("1", "t10"), "1|t10"]
    ids = group_ids(np.array(keys, dtype=object))
    assert_ids_match_equality(keys, ids)
    assert len(set(ids.tolist())) == len(keys) - 1


def test_group_ids_input_kinds():
    rng = random.Random(0)
    tuples = [(f"uid{rng.randrange(5)}", rng.randrange(3), rng.choice(["plan", "tool"]), 0) for _ in range(200)]
    assert_ids_match_equality(tuples, group_ids(tuples))  # list of equal-length tuples stays 1-D
    strings = ["|".join(map(str, t)) for t in tuples]
    assert_ids_match_equality(strings, group_ids(np.array(strings, dtype=object)))
    assert_ids_match_equality(strings, group_ids(np.array(strings)))  # fixed-width unicode
    ints = [rng.randrange(30) * 7 for _ in range(200)]
    assert_ids_match_equality(ints, group_ids(torch.tensor(ints)))


@pytest.mark.parametrize("bad", [["a", None, "b"], ["a", float("nan")], np.array([["a", "b"], ["c", "d"]])])
def test_group_ids_rejects_missing_or_2d_keys(bad):
    with pytest.raises(ValueError):
        group_ids(bad)


def test_group_stats_and_zero_variance_frac():
    keys = ["a", "a", "b", "c", "c", "c", "d", "d"]
    assert group_stats(keys) == {
        "at_grpo/num_groups": 4.0,
        "at_grpo/mean_group_size": 2.0,
        "at_grpo/singleton_frac": 0.25,
    }
    # multi-sample groups a, c, d: a and d are constant, c is not; singleton b does not count
    scores = torch.tensor([1.0, 1.0, 0.0, 2.0, 3.0, 2.0, 0.0, 0.0])
    assert zero_variance_frac(scores, keys) == pytest.approx(2 / 3)
    assert zero_variance_frac(torch.tensor([1.0, 2.0]), ["x", "y"]) == 0.0


def test_registered_with_verl_idempotently():
    assert get_adv_estimator_fn("at_grpo") is compute_at_grpo_advantage
    register_at_grpo()  # a second registration is a no-op
    reloaded = importlib.reload(sys.modules["pettingllms_verl.algo.at_grpo"])  # new function object
    assert get_adv_estimator_fn("at_grpo") is reloaded.compute_at_grpo_advantage


def test_registration_refuses_foreign_estimator():
    ours = ADV_ESTIMATOR_REGISTRY["at_grpo"]
    ADV_ESTIMATOR_REGISTRY["at_grpo"] = reference_advantage
    try:
        with pytest.raises(ValueError, match="already been registered"):
            register_at_grpo()
    finally:
        ADV_ESTIMATOR_REGISTRY["at_grpo"] = ours


@pytest.mark.parametrize("norm", [True, False])
def test_verl_compute_advantage_dispatches_to_at_grpo(norm):
    """verl's own compute_advantage (used by the V1 trainer for non-GRPO estimators) calls us."""
    rewards, mask, keys = random_batch(4)
    data = DataProto.from_dict(
        tensors={"token_level_rewards": rewards, "response_mask": mask, "reward_baselines": torch.zeros(len(keys))},
        non_tensors={"uid": keys},
    )
    config = AlgoConfig(adv_estimator="at_grpo", norm_adv_by_std_in_grpo=norm)
    # verl passes the std switch only through config: the keyword below must be ignored
    out = compute_advantage(data, adv_estimator="at_grpo", norm_adv_by_std_in_grpo=not norm, config=config)
    expected = torch.tensor(reference_advantage(rewards.sum(-1).tolist(), list(keys), norm)).unsqueeze(-1) * mask
    torch.testing.assert_close(out.batch["advantages"], expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.batch["returns"], expected, rtol=1e-5, atol=1e-5)


def test_the_control_shuffles_rewards_within_groups_only_keeping_each_groups_rewards_and_no_link_to_its_replies():
    from pettingllms_verl.algo import permute_within_groups

    index = ["p0|t0|tool|n0"] * 4 + ["p0|t0|plan|n0"] * 4 + ["p1|t0|tool|n0"]
    scores = [1.0, 0.0, 0.0, 0.5, 2.0, 2.0, 3.0, 4.0, 7.0]
    shuffled = permute_within_groups(scores, index, np.random.default_rng(0))
    for group in set(index):  # each group keeps its rewards (so its mean, std and advantages' scale), moved among its rows
        rows = [i for i, key in enumerate(index) if key == group]
        assert sorted(shuffled[rows]) == sorted(scores[i] for i in rows)
    assert shuffled[8] == 7.0  # a group of one keeps its reward
    again = permute_within_groups(scores, index, np.random.default_rng(0))
    assert np.array_equal(shuffled, again)  # seeded: a resumed run shuffles its steps as it would have
    # over many draws a reply's reward is any of its group's, equally often: no information on which reply earned it
    firsts = [permute_within_groups(scores, index, np.random.default_rng(seed))[0] for seed in range(2000)]
    assert {value: firsts.count(value) / len(firsts) for value in set(firsts)} == pytest.approx({1.0: 0.25, 0.0: 0.5, 0.5: 0.25}, abs=0.04)
    with pytest.raises(ValueError, match="3 keys for 2 rows"):
        permute_within_groups([1.0, 2.0], ["a", "a", "b"], np.random.default_rng(0))
