"""The asynchronous trainers end to end through ``python -m verl.trainer.main_ppo`` on CPU:
``mas_colocate_async`` with a model per role beside an adapter (L2 + L1, killed mid-run and resumed)
and with one shared model (L0); ``mas_separate_async`` with a model beside an adapter, each group on a
rollout pool of its own (L2 + L1, killed mid-run and resumed). Checked on the rows each step trained and on what the
runs logged and saved."""

import json
import os
import signal
import sys

import pytest

from pettingllms_verl.eval.reproduce.training import finished_steps

from support import RECIPES, launch
from support.asynchronous import ASYNC, PROBLEMS, SEPARATE, assert_trained_asynchronously_within_bounds, rows_by_step
from support.kill import kill_when, logged_steps
from support.runs import dumped_rows, run_recipe

pytestmark = pytest.mark.slow
MIXED = (  # tool_policy a full model on a pool of its own (L2) learning from fresh replies only, plan_policy a LoRA adapter on the base (L1)
    "+pettingllms.policies.tool_policy.pool=own", "+pettingllms.policies.tool_policy.n_gpus_per_node=1",
    "+pettingllms.policies.tool_policy.max_staleness=0", "ray_kwargs.ray_init.num_gpus=2", "+pettingllms.policies.plan_policy.adapter.rank=8",
)


def killed_in_step_3_and_resumed(artifacts, name: str, overrides: list[str], mode: str) -> tuple[list[dict], list[dict]]:
    """plan_path_mas_full_cpu for 3 steps (checkpoints under ``checkpoints/<name>``), SIGKILLed in
    step 3 once step 2 is logged (so saved), then the same command: the metrics of both runs. The
    resumed run trains step 3 alone, after restoring the problems under way at the kill (the warm-up
    batch the rollout ran ahead by)."""
    metrics_path = artifacts / f"{name}_killed.jsonl"
    env = {**os.environ, "PETTINGLLMS_ARTIFACTS": str(artifacts), "VERL_FILE_LOGGER_PATH": str(metrics_path)}
    command = [sys.executable, "-m", "verl.trainer.main_ppo", "--config-path", RECIPES, "--config-name", "plan_path_mas_full_cpu",
               *overrides, "trainer.total_training_steps=3", f"trainer.experiment_name={name}"]
    status = kill_when(command, lambda: logged_steps(metrics_path) >= 2, cwd=artifacts, env=env)
    assert status == -signal.SIGKILL and finished_steps(artifacts / "checkpoints" / name) == 2
    assert (artifacts / "checkpoints" / name / "global_step_2" / "transfer_queue").is_dir()
    killed = [json.loads(line) for line in open(metrics_path)]
    resumed_path = artifacts / f"{name}_resumed.jsonl"
    result = launch.main_ppo(*command[3:], timeout=1200, cwd=artifacts, env={**env, "VERL_FILE_LOGGER_PATH": str(resumed_path)})
    assert result.returncode == 0, (result.stdout[-4000:], result.stderr[-4000:])
    resumed = [json.loads(line) for line in open(resumed_path)]
    assert [m["step"] for m in resumed] == [3] and finished_steps(artifacts / "checkpoints" / name) == 3
    assert f"{mode}: {PROBLEMS} problems under way at step 2 restored" in result.stdout + result.stderr
    return killed, resumed


def test_a_model_per_role_beside_an_adapter_trains_asynchronously_and_resumes_its_episodes_under_way(artifacts):
    """3 steps, SIGKILLed in step 3 once step 2 is logged (so saved), then the same command: the
    resumed run restores the problems under way at the kill (the warm-up batch the rollout ran
    ahead by), trains step 3 on problems no earlier step trained, and every bound held throughout;
    tool_policy's own bound (0 pushes behind) leaves its older rows untrained, each counted."""
    dump = artifacts / "mixed_batches"
    killed, resumed = killed_in_step_3_and_resumed(artifacts, "mixed", [*ASYNC, *MIXED, f"pettingllms.paths.batch_dump_dir={dump}"],
                                                   "mas_colocate_async")
    assert_trained_asynchronously_within_bounds(killed + resumed, rows_by_step(dump), ("tool_policy", "plan_policy"))
    stale = {step: sum(row["mas_policy"] == "tool_policy" and bool(row["mas_weight_versions"]) and min(row["mas_weight_versions"]) < step - 1
                       for row in rows) for step, rows in rows_by_step(dump).items()}
    untrained = {m["step"]: m["data"]["policy/tool_policy/off_policy/untrained_rows"] for m in killed + resumed}
    assert untrained == stale and sum(stale.values()) > 0, (untrained, stale)  # the warm-up batch's rows: sampled a push behind
    served = {(row["mas_role"], tuple(row["mas_served_by"])) for row in dumped_rows(dump)}
    assert served == {("tool", ("tool_policy",)), ("plan", ("plan_policy",))}


def test_one_shared_model_trains_asynchronously(artifacts):
    dump = artifacts / "shared_batches"
    metrics = run_recipe(artifacts, "plan_path_mas_atgrpo_cpu", *ASYNC, "trainer.total_training_steps=2",
                         f"pettingllms.paths.batch_dump_dir={dump}")
    assert [m["step"] for m in metrics] == [1, 2]
    assert_trained_asynchronously_within_bounds(metrics, rows_by_step(dump), ("shared",))


def test_a_model_beside_an_adapter_trains_on_rollout_pools_of_their_own_and_resumes_its_episodes_under_way(artifacts):
    """mas_separate_async with tool_policy a full model (L2) and plan_policy a LoRA adapter on the
    base (L1): each group's replicas on a pool of their own, never paused to train; each step two
    updates per policy (one problem each), then a push per group over gloo (the adapter by name,
    and its server serves it under its own version). SIGKILLed
    in step 3 once step 2 is logged, then the same command: the problems under way come back and
    step 3 trains problems no earlier step trained. Every bound held, every group whole; the second
    update's old log-probs come from the weights the rollout had (step 1: no push yet, so each
    reply's log-probs equal the trainer's, though its weights moved after the first update)."""
    dump = artifacts / "separate_batches"
    overrides = [*SEPARATE, "ray_kwargs.ray_init.num_gpus=3", "+pettingllms.policies.plan_policy.adapter.rank=8",
                 f"pettingllms.paths.batch_dump_dir={dump}"]
    killed, resumed = killed_in_step_3_and_resumed(artifacts, "separate", overrides, "mas_separate_async")
    assert_trained_asynchronously_within_bounds(killed + resumed, rows_by_step(dump), ("tool_policy", "plan_policy"))
    for m in killed + resumed:  # each step pushed every policy's weights to its own pool
        assert m["data"]["timing_s/update_weights"] > 0
    served = {(row["mas_role"], tuple(row["mas_served_by"])) for row in dumped_rows(dump)}
    assert served == {("tool", ("tool_policy",)), ("plan", ("plan_policy",))}
