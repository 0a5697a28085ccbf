"""Shared by the checks: the error they raise, reading a key, each worker group's view of the config."""

from __future__ import annotations

import os
from typing import Any

from omegaconf import DictConfig, OmegaConf


class ConfigError(ValueError):
    """A config value that cannot work, with the key that holds it."""

    def __init__(self, key: str, problem: str, fix: str):
        super().__init__(f"{key}: {problem}\n  fix: {fix}")
        self.key = key


def select(config: DictConfig, key: str) -> Any:
    return OmegaConf.select(config, key, default=None)


def parse(config: DictConfig) -> Any:
    """The ``pettingllms`` section as its typed schema, read once for every check (None where the
    config has no such section)."""
    from pettingllms_verl.config import SECTION, SettingsError, load

    section = select(config, SECTION)
    if section is None:
        return None
    try:
        return load(section)
    except SettingsError as error:
        raise settings_error(error) from None


def settings_error(error: Exception) -> ConfigError:
    """A ``SettingsError`` ("key: problem") as the ConfigError that names its key."""
    key, _, problem = str(error).partition(": ")
    return ConfigError(key, problem, "every key and its help: docs/configuration.md")


def policy_views(config: DictConfig, settings: Any) -> list[tuple[str | None, DictConfig]]:
    """(worker group, the config its workers see) for each group; (None, config) without a pettingllms section."""
    from pettingllms_verl.config import policy_config

    if settings is None:
        return [(None, config)]
    return [(group, policy_config(config, group)) for group in settings.groups()]


def where(config: DictConfig, group: str | None, key: str) -> str:
    """The key a group's ``actor_rollout_ref.<key>`` was set by: its policy's overrides, else the run's."""
    override = f"pettingllms.policies.{group}.overrides.{key}"
    return override if group is not None and select(config, override) is not None else f"actor_rollout_ref.{key}"


def needs_critic(config: DictConfig) -> bool:
    """verl's ``need_critic``: ``critic.enable`` where set, else whether the estimator is gae."""
    enable = select(config, "critic.enable")
    return select(config, "algorithm.adv_estimator") == "gae" if enable is None else bool(enable)


def joins_cluster(config: DictConfig) -> str | None:
    """The address of a running Ray cluster the run joins (``ray_kwargs.ray_init.address``), else None."""
    address = select(config, "ray_kwargs.ray_init.address") or os.environ.get("RAY_ADDRESS")  # `ray job submit` sets it
    return None if address in (None, "", "local") else str(address)
