"""``main_ppo`` runs of the CPU recipes on a test's artifacts folder, and what they leave: metrics,
dumped training rows, checkpoints per step."""

import json
import os
import signal
import sys

from pettingllms_verl.eval.reproduce.training import finished_steps

from support import RECIPES, launch
from support.kill import kill_when, logged_steps


def dumped_rows(dump, through: int | None = None) -> list[dict]:
    """The training rows dumped to ``dump`` (a JSONL file per step, step_N.jsonl), of steps up to ``through``."""
    names = sorted(name for name in os.listdir(dump) if through is None or int(name[5:-6]) <= through)
    return [json.loads(line) for name in names for line in open(dump / name)]


def run_recipe(artifacts, recipe, *overrides):
    metrics_path = artifacts / f"{recipe}.jsonl"
    result = launch.main_ppo(
        "--config-path", RECIPES, "--config-name", recipe, *overrides, timeout=1200, cwd=artifacts,
        env={**os.environ, "PETTINGLLMS_ARTIFACTS": str(artifacts), "VERL_FILE_LOGGER_PATH": str(metrics_path)},
    )
    assert result.returncode == 0, (result.stdout[-4000:], result.stderr[-4000:])
    return [json.loads(line) for line in open(metrics_path)]


def write_math_fixture(artifacts) -> None:
    """The math problems shipped with the package as data/math_fixture: 4 for val, the rest for train."""
    from pettingllms_verl.data.sources import disjoint_splits, write_splits
    from pettingllms_verl.envs.base import fixture_tasks
    from pettingllms_verl.envs.math.env import FIXTURE

    tasks = list(fixture_tasks(FIXTURE))
    write_splits(disjoint_splits("math", tasks[4:], tasks[:4], None, None, val=4), str(artifacts / "data" / "math_fixture"), "team_artifacts")


K_MINI_BATCHES = 2  # plan_path_mas_full_cpu's pettingllms.trainer.mini_batches_per_step


def run_killed_in_step_4(artifacts, recipe: str, *overrides: str) -> list[dict]:
    """``recipe`` for 4 steps, SIGKILLed (the driver and its Ray processes) once step 3 is logged,
    so saved and validated (verl logs a step last): the metrics of steps 1-3."""
    metrics_path = artifacts / f"{recipe}_killed.jsonl"
    env = {**os.environ, "PETTINGLLMS_ARTIFACTS": str(artifacts), "VERL_FILE_LOGGER_PATH": str(metrics_path)}
    command = [sys.executable, "-m", "verl.trainer.main_ppo", "--config-path", RECIPES, "--config-name", recipe,
               "trainer.total_training_steps=4", *overrides]
    status = kill_when(command, lambda: logged_steps(metrics_path) >= 3, cwd=artifacts, env=env)
    assert status == -signal.SIGKILL and finished_steps(artifacts / "checkpoints" / recipe) == 3
    return [json.loads(line) for line in open(metrics_path)]


def resume_step_4(artifacts, recipe: str, *overrides: str) -> list[dict]:
    """The killed run's command again (``trainer.total_training_steps=4``): it resumes from step 3's
    checkpoint and trains step 4 alone; its metrics."""
    metrics = run_recipe(artifacts, recipe, "trainer.total_training_steps=4", *overrides)
    assert [m["step"] for m in metrics] == [4]
    assert finished_steps(artifacts / "checkpoints" / recipe) == 4
    return metrics


def assert_three_steps_with_metrics_per_policy(metrics: list[dict], policies) -> None:
    assert [m["step"] for m in metrics] == [1, 2, 3]
    for m in metrics:
        data = m["data"]
        for policy in policies:
            assert data[f"policy/{policy}/rows"] > 0
            for key in ("reward_mean", "actor/grad_norm", "actor/pg_loss", "actor/lr"):
                assert f"policy/{policy}/{key}" in data, (policy, key)
            # each policy's replicas sampled from its own current weights (fp32 both sides)
            assert data[f"policy/{policy}/training/rollout_probs_diff_mean"] < 1e-5
        assert "mas/success" in data and "at_grpo/num_groups" in data
