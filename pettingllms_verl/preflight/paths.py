"""Models and data files: a local folder, a hub id reachable or cached, the datasets, the first training row."""

from __future__ import annotations

import os
from typing import Any

from omegaconf import DictConfig

from pettingllms_verl import artifacts
from pettingllms_verl.preflight.common import ConfigError, select

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


def _check_model_path(key: str, model_path: Any) -> None:
    if not model_path:
        raise ConfigError(key, "not set", "point it at a HF model directory or hub id")
    if not os.path.isdir(os.path.expanduser(model_path)):
        problem = "model directory not found" if _is_local_path(model_path) else _hub_model_problem(model_path)
        if problem:
            target = artifacts.make_target(str(model_path))
            raise ConfigError(
                key,
                f"{problem}: {model_path}" + (f" (looked in {artifacts.where()})" if target else ""),
                (f"build it with `{target}` in the repository, " if target else "")
                + "download the model where there is network (`hf download <id> --local-dir DIR`), "
                f"or set {key}=<dir>",
            )


def _train_env(config: DictConfig) -> tuple[str, int, dict] | None:
    """(env name, seed, task) of the first training row (data.train_files), if it is an episode row."""
    files = select(config, "data.train_files")
    path = files if isinstance(files, str) else (list(files)[0] if files else None)
    if not path or not str(path).endswith(".parquet") or not os.path.getsize(os.path.expanduser(path)):
        return None
    import pyarrow.parquet as pq

    from pettingllms_verl.data.rows import row_task

    table = pq.ParquetFile(os.path.expanduser(path))
    if "extra_info" not in table.schema_arrow.names or not table.metadata.num_rows:
        return None
    extra_info = table.read_row_group(0, columns=["extra_info"]).column(0)[0].as_py()
    return row_task(extra_info) if isinstance(extra_info, dict) and "env" in extra_info else None


def _check_datasets(config: DictConfig) -> None:
    """Every data file the config names exists (a missing one names the make target that builds it)."""
    for key in ("data.train_files", "data.val_files"):
        files = select(config, key)
        if files is None:
            continue
        for path in [files] if isinstance(files, str) else list(files):
            if not os.path.exists(os.path.expanduser(path)):
                target = artifacts.make_target(str(path))
                raise ConfigError(
                    key,
                    f"dataset file not found: {path}" + (f" (looked in {artifacts.where()})" if target else ""),
                    (f"build it with `{target}` in the repository (the data_prep command written in the recipe's "
                     "recipes/base/data/ file)" if target else "run the matching data_prep script (docs/environments.md)")
                    + f", or set {key}=<parquet path>",
                )
