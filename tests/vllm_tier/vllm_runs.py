"""The vLLM tier's runs: a recipe through `python -m verl.trainer.main_ppo`, with its metrics and the
rows that reached the trainer."""

import json
import os
from pathlib import Path

from support import RECIPES, launch

STEPS = 3
# fp32 on both sides, different kernels (vLLM's CPU attention, GEMMs and LoRA against torch's): the
# rollout's and the actor's probabilities of a token differ by ~1e-6 at most when the weights are
# the same; a step the rollout missed shows the actor's update instead
PROB_GAP = 1e-5


def train(root: Path, recipe: str, *overrides: str) -> tuple[list[dict], list[dict], str]:
    """(metrics per step, training rows, main_ppo's output) of STEPS steps of ``recipe``."""
    metrics_path, dump = root / f"{recipe}.jsonl", root / f"{recipe}_batches"
    result = launch.main_ppo(
        "--config-path", RECIPES, "--config-name", recipe, f"trainer.total_training_steps={STEPS}",
        f"pettingllms.paths.batch_dump_dir={dump}", *overrides, timeout=1200, cwd=root,
        env={**os.environ, "PETTINGLLMS_ARTIFACTS": str(root), "VERL_FILE_LOGGER_PATH": str(metrics_path)},
    )
    assert result.returncode == 0, (result.stdout[-4000:], result.stderr[-4000:])
    metrics = [json.loads(line)["data"] for line in open(metrics_path)]
    rows = [json.loads(line) for name in sorted(os.listdir(dump)) for line in open(dump / name)]
    return metrics, rows, result.stdout + result.stderr


def assert_served_by_own_policy(rows: list[dict], policy_of: dict[str, str]) -> None:
    """Every reply came from its role's policy, as the server that answered names it."""
    assert {row["mas_role"] for row in rows} == set(policy_of)
    for row in rows:
        assert row["mas_policy"] == policy_of[row["mas_role"]]
        assert row["mas_served_by"] == [row["mas_policy"]]


def weight_versions(rows: list[dict], role: str) -> set[tuple]:
    """The server's weight versions behind a role's replies, one tuple per episode."""
    return {tuple(row["mas_weight_versions"]) for row in rows if row["mas_role"] == role}
