"""The vLLM tier's artifacts: the warm-started tiny model and Plan-Path 6x6 (tests/vllm_tier/vllm_runs.py runs the recipes on them)."""

import pytest


@pytest.fixture(scope="module")
def plan_path_artifacts(tmp_path_factory, warm_model):
    """A PETTINGLLMS_ARTIFACTS folder for the plan_path_*_vllm_cpu recipes: the tiny model warm-started
    on well-formed replies (rewards differ, so the weights move) and small splits."""
    from pettingllms_verl.data.rows import write_parquet
    from pettingllms_verl.envs.splits import generate_splits

    root = tmp_path_factory.mktemp("vllm")
    warm_model("plan_path", root / "tiny_model_plan_path")
    for split, rows in generate_splits("plan_path", {"train": 32, "val": 4, "test": 3}, {"size": 6}).items():
        write_parquet(rows, str(root / "data" / "plan_path_6x6" / f"{split}.parquet"))
    return root
