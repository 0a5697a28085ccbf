"""Test-wide settings: offline, deterministic, CPU."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    """The deterministic tiny model + tokenizer, built once per test session."""
    from pettingllms_verl.models.tiny import build

    return build(str(tmp_path_factory.mktemp("tiny_model")), seed=0)
