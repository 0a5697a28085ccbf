"""Config checks that run in the driver before verl starts Ray.

A missing model or dataset file otherwise surfaces minutes later as a stack trace inside a Ray
worker's log. Recipes enable this as a Hydra callback (``hydra.callbacks.preflight``); it prints
which config key holds the bad value, the value, and what to do, then exits with status 2.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf


class ConfigError(ValueError):
    """A config value that cannot work, with the key that holds it."""

    def __init__(self, key: str, problem: str, fix: str):
        super().__init__(f"{key}: {problem}\n  fix: {fix}")
        self.key = key


def _select(config: DictConfig, key: str) -> Any:
    return OmegaConf.select(config, key, default=None)


def _is_local_path(value: str) -> bool:
    # Hub ids look like "org/name"; anything absolute, relative-dotted or with a scheme is local.
    return value.startswith(("/", "./", "../", "~")) or os.sep in value and value.count("/") > 1


def _hub_model_problem(model_id: str) -> str | None:
    """Why a hub id cannot be loaded here, or None: in the local HF cache, or the hub answers.

    Without this the first sign of no network is a connection error inside a Ray worker.
    """
    import httpx  # huggingface_hub's HTTP client: its transport errors mean "no network"
    from huggingface_hub import HfApi, try_to_load_from_cache
    from huggingface_hub.errors import HFValidationError, RepositoryNotFoundError

    try:
        if isinstance(try_to_load_from_cache(model_id, "config.json"), str):
            return None
    except HFValidationError:
        return "neither a directory nor a valid hub id"
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        return "not a directory and not in the local HF cache (HF_HUB_OFFLINE=1: no download)"
    try:
        HfApi().model_info(model_id, timeout=10)
    except RepositoryNotFoundError:
        return "no such model on the hub (or it is private: log in with `hf auth login`)"
    except (httpx.TransportError, OSError) as error:
        return f"not in the local HF cache and the hub is unreachable ({type(error).__name__}: {error})"
    except Exception:  # gated repos, rate limits...: transformers reports those itself
        return None
    return None


def _registered_names() -> dict[str, list[str]]:
    """Config keys whose value verl looks up in a registry, with the registered names (this
    plugin's included: its entry point may not have run in this process yet)."""
    from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY
    from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY
    from verl.workers.rollout.base import _ROLLOUT_REGISTRY

    from pettingllms_verl.registration import register

    register()
    return {
        "actor_rollout_ref.rollout.name": sorted({name for name, _mode in _ROLLOUT_REGISTRY}),
        "algorithm.adv_estimator": sorted(ADV_ESTIMATOR_REGISTRY),
        "trainer.v1.trainer_mode": sorted(TRAINER_REGISTRY),
    }


def _check_registered(config: DictConfig, key: str, names: list[str]) -> None:
    """A name verl looks up in a registry; a typo otherwise fails inside a Ray worker minutes later."""
    value = _select(config, key)
    if value is not None and str(value) not in names:
        raise ConfigError(key, f"unknown name {value!r}", f"use one of: {', '.join(names)}")


def check(config: DictConfig) -> None:
    """Raise ``ConfigError`` for the first problem found."""
    model_path = _select(config, "actor_rollout_ref.model.path")
    if not model_path:
        raise ConfigError("actor_rollout_ref.model.path", "not set", "point it at a HF model directory or hub id")
    if not os.path.isdir(os.path.expanduser(model_path)):
        problem = "model directory not found" if _is_local_path(model_path) else _hub_model_problem(model_path)
        if problem:
            raise ConfigError(
                "actor_rollout_ref.model.path",
                f"{problem}: {model_path}",
                "build the tiny model with `make model` (python -m pettingllms_verl.models.tiny --out DIR), "
                "download the model where there is network (`hf download <id> --local-dir DIR`), "
                "or set actor_rollout_ref.model.path=<dir>",
            )
    for key in ("data.train_files", "data.val_files"):
        files = _select(config, key)
        if files is None:
            continue
        for path in [files] if isinstance(files, str) else list(files):
            if not os.path.exists(os.path.expanduser(path)):
                raise ConfigError(
                    key,
                    f"dataset file not found: {path}",
                    "run the matching data_prep script (see README, e.g. `make data`) or set "
                    f"{key}=<parquet path>",
                )
    if _select(config, "pettingllms") is not None:
        from pettingllms_verl.rollout.settings import RolloutSettings, SettingsError

        try:
            RolloutSettings.from_config(config.pettingllms)
        except SettingsError as error:
            key, _, problem = str(error).partition(": ")
            raise ConfigError(key, problem, "see the `pettingllms:` section in the README") from None
    for key, names in _registered_names().items():
        _check_registered(config, key, names)
    if _select(config, "actor_rollout_ref.rollout.name") == "hf":
        for key in ("tensor_model_parallel_size", "data_parallel_size", "pipeline_model_parallel_size"):
            size = _select(config, f"actor_rollout_ref.rollout.{key}")
            if size is not None and int(size) != 1:
                raise ConfigError(
                    f"actor_rollout_ref.rollout.{key}",
                    f"{size}: the hf rollout serves one whole model copy per trainer rank (no model parallelism)",
                    f"set actor_rollout_ref.rollout.{key}=1",
                )
        world = int(_select(config, "trainer.n_gpus_per_node") or 0) * int(_select(config, "trainer.nnodes") or 1)
        declared = _select(config, "ray_kwargs.ray_init.num_gpus")
        if declared is not None and int(declared) < world:
            raise ConfigError(
                "ray_kwargs.ray_init.num_gpus",
                f"{declared} Ray GPU slots for {world} trainer ranks (trainer.n_gpus_per_node x trainer.nnodes)",
                f"set ray_kwargs.ray_init.num_gpus={world} (on CPU these are slots, not devices)",
            )


class Preflight(Callback):
    """Hydra callback: ``check`` the composed config before the job (verl's ``main``) runs."""

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        try:
            check(config)
        except ConfigError as error:
            print(f"\npettingllms_verl: config error in {error}\n", file=sys.stderr, flush=True)
            raise SystemExit(2) from None
