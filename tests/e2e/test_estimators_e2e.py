"""verl's other estimators on per-turn team rows, through `python -m verl.trainer.main_ppo` on CPU:
one shared policy (L0), Plan-Path MAS, independent episodes (rollout.n = 4), one step each. Every
row of an episode (each turn of each role) carries the episode's return and is trained with the
estimator's advantage of it (docs/training.md); gae, with a critic per policy, is in
tests/e2e/test_critic_e2e.py. One episode of each run fails before its first reply (``faulty_env.py``):
its placeholder row is a group of its own, so the real rows' advantages are those of the real rows
alone."""

import json
from collections import defaultdict

import numpy as np
import pytest
import torch
from verl import DataProto
from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories

from support.faulty_env import OVERRIDE as FAULTY
from support.runs import run_recipe

pytestmark = pytest.mark.slow
N = 4
PLAN_PATH_SPLITS = {"train": 8, "val": 2}  # the artifacts fixture's (e2e/conftest.py): a short validation



@pytest.mark.parametrize("estimator", ["grpo", "rloo", "reinforce_plus_plus"])
def test_an_estimator_trains_the_team_rows_of_each_episode_on_its_return(artifacts, estimator):
    dump = artifacts / f"{estimator}_batches"
    metrics = run_recipe(
        artifacts, "plan_path_mas_atgrpo_cpu", f"algorithm.adv_estimator={estimator}", "pettingllms.rollout_mode=independent",
        f"actor_rollout_ref.rollout.n={N}", f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={2 * N}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={2 * N}", "trainer.total_training_steps=1",
        "trainer.save_freq=-1", f"trainer.default_local_dir={artifacts / estimator}", f"pettingllms.paths.batch_dump_dir={dump}",
        FAULTY, f"+pettingllms.env_kwargs.fail_first_once={artifacts / estimator}_failed",
    )
    (step,) = metrics
    data = step["data"]
    assert "mas/plan/reward_mean" in data and "mas/tool/reward_mean" in data
    assert data["mas/placeholder_rows"] == 1 and data["mas/episode_errors/env_error"] == 1
    every = [json.loads(line) for line in open(dump / "step_1.jsonl")]
    (placeholder,) = [row for row in every if row["mas_placeholder"]]
    rows = [row for row in every if not row["mas_placeholder"]]
    assert placeholder["group"] not in {row["group"] for row in rows}  # its own group, not its problem's
    if estimator != "reinforce_plus_plus":  # grouped estimators: the real rows' advantages, as if the failed episode were not there
        alone = compute_advantage_for_multi_trajectories(  # verl's own step, on the real rows alone (one token each)
            DataProto.from_dict(tensors={"token_level_rewards": torch.tensor([[row["score"]] for row in rows]), "response_mask": torch.ones(len(rows), 1)},
                                non_tensors={"uid": np.array([row["group"] for row in rows], dtype=object)}),
            batch_keys=[row["key"] for row in rows], adv_estimator=estimator, num_repeat=N,
        ).batch["advantages"][:, 0]
        assert [row["advantage"] for row in rows] == pytest.approx(alone.tolist(), abs=1e-4)
    assert {(row["mas_role"], row["mas_turn"]) for row in rows} >= {("tool", 0), ("plan", 0)}  # a row per turn and role
    episodes = defaultdict(list)  # verl's row key: <uid>_<session>_<row>
    for row in rows:
        episodes[row["key"].rsplit("_", 1)[0]].append(row)
    assert len(episodes) == 2 * N - 1  # two problems, N episodes each, one failed
    for members in episodes.values():  # every row of an episode: the episode's return and advantage
        assert len({round(row["score"], 6) for row in members}) == 1
        assert len({round(row["advantage"], 5) for row in members}) == 1
    signal = any(abs(row["advantage"]) > 1e-6 for row in rows)
    assert signal == (len({round(row["score"], 6) for row in rows}) > 1)
    assert (data["actor/grad_norm"] > 0) == signal
