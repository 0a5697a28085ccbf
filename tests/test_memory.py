"""A CPU run's memory is estimated before Ray starts, and a setting that cannot fit is refused
naming the key to lower (``pettingllms_verl/memory.py``, ``preflight.check_memory``)."""

import os
import subprocess
import sys

import pytest
from hydra import compose, initialize_config_dir

from pettingllms_verl import memory
from pettingllms_verl.data.rows import write_parquet
from pettingllms_verl.envs.splits import generate_splits
from pettingllms_verl.models import smollm2
from pettingllms_verl.preflight import ConfigError, check_memory, estimate_memory

from support import RECIPES

LAPTOP = 24 * memory.GiB  # the machine the real model's recipes were run on


@pytest.fixture(scope="module")
def real_model() -> str:
    return smollm2.convert(os.path.join(smollm2.artifacts_dir(), smollm2.FOLDER))  # make real-model built it; idempotent


def test_one_server_estimate_matches_the_engine_measured_alone(real_model):
    """RESULTS ("Evaluation memory"): the hf engine alone, SmolLM2-135M, 64 rows, 256-token replies,
    peaked at 7.6 GB with 1,000-token prompts and 4.8 GB with 600-token ones. Counting the cache a
    shared prefill copies from (rows x prompt) is what brings the estimate there."""
    model = memory.ModelSize.of(real_model)
    for prompt, measured in ((1000, 7.6e9), (600, 4.8e9)):
        estimate = memory.server_bytes(model, 64, prompt, 256) + memory.PROCESS_BYTES
        assert abs(estimate - measured) / measured < 0.15, (prompt, estimate)
        without_the_prefill_cache = estimate - 64 * prompt * model.kv_bytes_per_token
        assert abs(without_the_prefill_cache - measured) / measured > 0.15


def composed(recipe: str, *overrides: str):
    with initialize_config_dir(config_dir=RECIPES, version_base=None):
        return compose(config_name=recipe, overrides=list(overrides))


@pytest.fixture(scope="module")
def test_split(tmp_path_factory) -> str:
    """A Plan-Path test split of 256 problems (what ``make reproduce-real`` evaluates at once, 64 at a time)."""
    path = str(tmp_path_factory.mktemp("memory") / "test.parquet")
    write_parquet(generate_splits("plan_path", {"test": 256}, {"size": 6})["test"], path)
    return path


@pytest.mark.parametrize("recipe", ["plan_path_mas_lora_smollm2_cpu", "plan_path_mas_lora_smollm2_repro_cpu"])
def test_the_real_models_recipes_fit_the_machine_they_ran_on_in_training_and_evaluation(recipe, real_model, test_split):
    for mode in ("trainer.val_only=false", "trainer.val_only=true"):
        check_memory(composed(recipe, f"actor_rollout_ref.model.path={real_model}", f"data.val_files=[{test_split}]", mode), LAPTOP)


def test_the_evaluation_that_was_killed_for_memory_is_refused_and_the_suggested_setting_fits(real_model, test_split):
    """256 episodes at once on the real model: the hf server grew past 16.8 GB and Ray killed it on a
    24 GB machine. Refused now, naming the engine's batch and a value that fits."""
    overrides = [f"actor_rollout_ref.model.path={real_model}", f"data.val_files=[{test_split}]", "trainer.val_only=true",
                 "data.val_batch_size=256"]
    with pytest.raises(ConfigError) as error:
        check_memory(composed("plan_path_mas_lora_smollm2_repro_cpu", *overrides), LAPTOP)
    assert error.value.key == "actor_rollout_ref.rollout.max_num_seqs"
    message = str(error.value)
    assert "256 rows of up to 1024 + 256 tokens" in message and "this machine's 24.0 GiB" in message
    suggested = message.split("set actor_rollout_ref.rollout.max_num_seqs=")[1].split(" ")[0]
    assert 64 <= int(suggested) < 256
    check_memory(composed("plan_path_mas_lora_smollm2_repro_cpu", *overrides, f"actor_rollout_ref.rollout.max_num_seqs={suggested}"), LAPTOP)


def test_models_that_cannot_fit_at_any_batch_name_the_model(real_model):
    with pytest.raises(ConfigError) as error:
        check_memory(composed("plan_path_mas_lora_smollm2_cpu", f"actor_rollout_ref.model.path={real_model}"), 2 * memory.GiB)
    assert error.value.key == "actor_rollout_ref.model.path" and "its models alone exceed this machine's 2.0 GiB" in str(error.value)


def test_a_model_per_role_counts_a_trainer_a_server_and_their_processes_per_policy(tiny_model_dir):
    """plan_path_mas_full_cpu (L2, two policies) against plan_path_mas_atgrpo_cpu (L0) on the same
    model: one more policy's weights, gradients and Adam moments, its server's weights, and two
    processes; each server batching the same rows."""
    model = memory.ModelSize.of(tiny_model_dir)
    l0, l2 = (estimate_memory(composed(recipe, f"actor_rollout_ref.model.path={tiny_model_dir}"))
              for recipe in ("plan_path_mas_atgrpo_cpu", "plan_path_mas_full_cpu"))
    assert l2.fixed - l0.fixed == model.params * 4 * (4 + 1) + 2 * memory.PROCESS_BYTES
    assert l2.per_row == 2 * l0.per_row and l2.rows == l0.rows


def test_main_ppo_refuses_a_batch_that_cannot_fit_before_ray_starts(tmp_path, tiny_model_dir):
    from pettingllms_verl.data.quickstart import rows

    write_parquet(rows(4, 0, "train"), str(tmp_path / "data/quickstart/train.parquet"))
    write_parquet(rows(4, 1, "test"), str(tmp_path / "data/quickstart/test.parquet"))
    result = subprocess.run(
        [sys.executable, "-m", "verl.trainer.main_ppo", "--config-path", RECIPES, "--config-name", "quickstart_cpu",
         f"actor_rollout_ref.model.path={tiny_model_dir}", "data.train_batch_size=100000000",
         "actor_rollout_ref.rollout.max_num_seqs=100000000"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env={**os.environ, "PETTINGLLMS_ARTIFACTS": str(tmp_path)},
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert "config error in actor_rollout_ref.rollout.max_num_seqs: the run needs about" in result.stderr
    assert "Traceback" not in result.stderr and "ray init" not in result.stdout.lower()


def test_folded_adapters_count_a_model_copy_each_on_their_server(tiny_model_dir):
    """plan_path_mas_lora_cpu (L1, two adapters on one server): the hf engine folds each adapter into a
    copy of the adapted weights (``engine_kwargs.hf.merge_adapters``, on by default on CPU); the
    estimate counts up to a model copy per adapter, and none when folding is off."""
    model = memory.ModelSize.of(tiny_model_dir)
    folded, unfolded = (estimate_memory(composed("plan_path_mas_lora_cpu", f"actor_rollout_ref.model.path={tiny_model_dir}", *extra))
                        for extra in ((), ("++actor_rollout_ref.rollout.engine_kwargs.hf.merge_adapters=false",)))
    assert folded.fixed - unfolded.fixed == 2 * model.params * 4
    assert folded.per_row == unfolded.per_row
