"""Config checks that run in the driver before verl starts Ray.

A missing model or dataset file otherwise surfaces minutes later as a stack trace inside a Ray
worker's log. Recipes enable this as a Hydra callback (``hydra.callbacks.preflight``); it prints
which config key holds the bad value, the value, and what to do, then exits with status 2.

One room per concern: ``paths`` (models and data files), ``code`` (user code and the sandbox),
``policies`` (the policy table, adapters, images), ``training`` (trainer mode, estimators, settings
that disagree), ``engines`` (vLLM, Megatron, attention, the hf rollout), ``resources`` (GPU slots,
memory, a cluster); ``common`` holds the error and the reading of the config. The ``pettingllms``
section is parsed once, here, and handed to every check that reads it.
"""

from __future__ import annotations

import functools

import sys
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from pettingllms_verl import artifacts, memory
from pettingllms_verl.config import TRAINER_MODES
from pettingllms_verl.preflight.common import ConfigError, parse, policy_views, select
from pettingllms_verl.preflight.engines import _check_attention, _check_hf_rollout, _check_megatron, _check_vllm
from pettingllms_verl.preflight.paths import _check_datasets, _check_model_path
from pettingllms_verl.preflight.policies import _check_policies
from pettingllms_verl.preflight.resources import _check_cluster, _check_gpu_slots, check_memory, estimate_memory
from pettingllms_verl.preflight.training import (
    _check_agreement,
    _check_null_reward,
    _check_one_temperature,
    _check_registered,
    _check_separate_async,
    _check_staleness_bounds,
    _check_trainer_mode,
    _registered_names,
)

__all__ = ["ConfigError", "Preflight", "check", "check_memory", "estimate_memory"]


def check(config: DictConfig) -> None:
    """Raise ``ConfigError`` for the first problem found."""
    _check_model_path("actor_rollout_ref.model.path", select(config, "actor_rollout_ref.model.path"))
    _check_datasets(config)
    settings = None
    if select(config, "pettingllms") is not None:
        _check_trainer_mode(config)
        settings = parse(config)
    views = functools.cache(functools.partial(policy_views, config, settings))  # each worker group's config, built once when first read
    if settings is not None:
        _check_policies(config, settings, views)
    for key, names in _registered_names().items():
        _check_registered(config, key, names)
    _check_agreement(config, settings)
    if settings is not None:
        _check_staleness_bounds(config, settings)
        _check_separate_async(config, settings)
        _check_one_temperature(config, select(config, "trainer.v1.trainer_mode") in TRAINER_MODES, views(), settings)
    _check_vllm(config, views(), settings)
    _check_megatron(config, views())
    _check_attention(config, views())
    _check_null_reward(config)
    _check_hf_rollout(config)
    check_memory(config, memory.system_memory(), settings, views())
    _check_cluster(config)
    _check_gpu_slots(config, settings)


class Preflight(Callback):
    """Hydra callback: ``check`` the composed config before the job (verl's ``main``) runs."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        # Before Hydra copies the config for the job: what is written here reaches every Ray process.
        found = artifacts.use_working_directory()  # before anything reads the recipe's paths
        if found:
            print(f"pettingllms_verl: artifacts from the working directory, {found} (${artifacts.ENV} was unset)", flush=True)
        artifacts.pin(config)

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        artifacts.use_working_directory()  # a --multirun job: Hydra calls no on_run_start
        try:
            check(config)
        except ConfigError as error:
            print(f"\npettingllms_verl: config error in {error}\n", file=sys.stderr, flush=True)
            raise SystemExit(2) from None
