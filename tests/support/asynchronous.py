"""What an asynchronous run (``mas_colocate_async``) must show in the rows each step trained and in
what it logged: every bound held, every group whole, no problem trained twice. Shared by the CPU
end-to-end tests (``e2e/test_async_e2e.py``) and the vLLM tier's asynchronous launch."""

import json
import os
from collections import defaultdict

BOUND = 2  # trainer.v1.sampler.max_off_policy_threshold: a group trained at most 2 steps after its prompt went out
ASYNC = ("trainer.v1.trainer_mode=mas_colocate_async", f"trainer.v1.sampler.max_off_policy_threshold={BOUND}")
# each policy's rollout on a pool of its own (one Ray slot each beside the trainer's), weights pushed over gloo
# after every 2 updates (one problem each: the second scored with the weights its rollout had)
SEPARATE = ("trainer.v1.trainer_mode=mas_separate_async", f"trainer.v1.sampler.max_off_policy_threshold={BOUND}",
            "actor_rollout_ref.hybrid_engine=false", "actor_rollout_ref.rollout.nnodes=1", "actor_rollout_ref.rollout.n_gpus_per_node=1",
            "actor_rollout_ref.rollout.checkpoint_engine.backend=gloo", "trainer.v1.separate_async.parameter_sync_step=2")
K = 4  # base/cpu_mas_atgrpo: branches per tree node
PROBLEMS = 2  # its data.train_batch_size


def problem(row: dict) -> str:
    return row["group"].split("|")[0]  # the problem's uid in verl's queue


def assert_trained_asynchronously_within_bounds(metrics: list[dict], rows_by_step: dict[int, list[dict]], policies) -> None:
    """Metrics per step and rows per step (``rows_by_step``) of a run under ``ASYNC``: each of the
    trainable ``policies`` trained on rows within verl's bound, every group whole and in one step."""
    for m in metrics:
        step, data = m["step"], m["data"]
        for policy in policies:
            assert data[f"policy/{policy}/rows"] > 0
            assert 0 <= data[f"policy/{policy}/off_policy/staleness_max"] <= BOUND - 1
        if step == 1:  # nothing was pushed before step 1: every reply is from the weights it trains
            for policy in policies:
                assert data[f"policy/{policy}/training/rollout_probs_diff_mean"] < 1e-5
        assert data["training/off_policy/trajectory_staleness_worst/max"] <= BOUND - 1
    for step, rows in rows_by_step.items():
        for row in (row for row in rows if row["mas_policy"] in policies):  # a frozen policy's weights are never pushed again
            # each row records the versions its role's replies came from: pushed before this step, within the bound
            assert row["mas_weight_versions"] and max(row["mas_weight_versions"]) <= step - 1
            assert step - 1 - min(row["mas_weight_versions"]) <= BOUND - 1
        # every AT-GRPO group whole: a tree node's K branches, all in this step
        sizes = defaultdict(int)
        for row in rows:
            if not row["mas_placeholder"]:
                sizes[row["group"]] += 1
        assert set(sizes.values()) == {K}, sizes
        assert len({problem(row) for row in rows}) == PROBLEMS
    # a problem is trained in one step only
    seen: dict[str, int] = {}
    for step, rows in sorted(rows_by_step.items()):
        for uid in {problem(row) for row in rows}:
            assert uid not in seen, f"problem {uid} trained at steps {seen[uid]} and {step}"
            seen[uid] = step


def rows_by_step(dump) -> dict[int, list[dict]]:
    """step -> the rows it trained (``pettingllms.paths.batch_dump_dir``'s files, ``step_<N>.jsonl``)."""
    by_step = defaultdict(list)
    for name in os.listdir(dump):
        by_step[int(name[5:-6])] = [json.loads(line) for line in open(dump / name)]
    return dict(by_step)
