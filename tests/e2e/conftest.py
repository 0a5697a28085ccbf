"""The end-to-end tests' shared fixture: a folder of what the CPU recipes read, per test module."""

import pytest

PLAN_PATH_SPLITS = {"train": 32, "val": 4, "test": 4}  # Plan-Path 6x6 problems per split (a module may set its own)


@pytest.fixture(scope="module")
def artifacts(request, tmp_path_factory, warm_model):
    """``$PETTINGLLMS_ARTIFACTS`` for one test module: the tiny model as built (``tiny_model``) and
    warm-started on Plan-Path (``tiny_model_plan_path``), Plan-Path 6x6 (the module's
    ``PLAN_PATH_SPLITS``, else the splits above) and Tic-Tac-Toe against a random opponent. A module
    that needs more (the math or code team) adds it in a fixture of its own on top of this one."""
    from pettingllms_verl.data.rows import write_parquet
    from pettingllms_verl.envs.splits import generate_splits
    from pettingllms_verl.models.tiny import build

    root = tmp_path_factory.mktemp(request.module.__name__.removeprefix("test_"))
    warm_model("plan_path", root / "tiny_model_plan_path")
    build(str(root / "tiny_model"), seed=0)
    splits = getattr(request.module, "PLAN_PATH_SPLITS", PLAN_PATH_SPLITS)
    for split, rows in generate_splits("plan_path", splits, {"size": 6}).items():
        write_parquet(rows, str(root / "data" / "plan_path_6x6" / f"{split}.parquet"))
    for split, rows in generate_splits("tictactoe", {"train": 16, "val": 4}, {"first": "random", "opponent": "random"}).items():
        write_parquet(rows, str(root / "data" / "tictactoe_random" / f"{split}.parquet"))
    return root
