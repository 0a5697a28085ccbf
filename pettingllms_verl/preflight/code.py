"""User code and model-written code: the run's environments, rewards and team program load here as
in every worker; code the model writes needs an isolating sandbox."""

from __future__ import annotations

import os
from typing import Any

from pettingllms_verl.preflight.common import ConfigError

def _check_sandbox(env_name: str) -> None:
    """Code the model writes needs an isolating sandbox; where the OS grants none, say so here
    rather than as a failed episode in every rollout worker."""
    from pettingllms_verl.sandbox import client

    try:
        client.isolation()
    except client.SandboxUnavailable as error:
        raise ConfigError(
            client.ALLOW_UNISOLATED_ENV, f"the {env_name!r} environment runs model-written code, and {error.problem}", error.fix
        ) from None


def _check_user_code(settings: Any) -> None:
    """The run's own environments and reward functions load here as they will in every worker."""
    from pettingllms_verl import envs
    from pettingllms_verl.config import SECTION
    from pettingllms_verl.targets import TargetError

    for name, target in settings.envs.items():
        envs.register_env(name, target)
        try:
            envs.env_class(name)
        except (TargetError, TypeError) as error:
            raise ConfigError(f"{SECTION}.envs.{name}", str(error), "name an Env subclass as 'package.module:Class' or 'file.py:Class'") from None
    for role, role_config in settings.roles.items():
        if role_config.reward is not None:
            _check_function(f"{SECTION}.roles.{role}.reward", role_config.reward, "name a function as 'package.module:fn' or 'file.py:fn'",
                            "fn(role=, reply=, result=, env=) -> float")


def _check_function(key: str, target: str, fix: str, signature: str) -> None:
    """User code named in the config (``targets.py``) loads here as it will in every worker, and is a function."""
    from pettingllms_verl.targets import TargetError, load_target

    try:
        fn = load_target(target)
    except TargetError as error:
        raise ConfigError(key, str(error), fix) from None
    if not callable(fn):
        raise ConfigError(key, f"{target!r} is {fn!r}, not a function", f"name a function {signature}")


def _check_program(settings: Any) -> None:
    """A team program: its function (or command) and reward function are found from here, the
    directory its runs start in (``programs.program.LAUNCH_DIR``), and every policy serves an agent."""
    import shutil

    from pettingllms_verl.programs.program import LAUNCH_DIR
    from pettingllms_verl.config import SECTION

    os.environ.setdefault(LAUNCH_DIR, os.getcwd())  # before Ray starts: its workers inherit it
    program = settings.program
    for key, target, signature in (("target", program.target, "fn(task, client)"), ("reward", program.reward, "fn(task=, transcript=, output=)")):
        if target is not None:
            _check_function(
                f"{SECTION}.program.{key}", target,
                "name a function as 'package.module:fn' or 'file.py:fn' (a relative file from where main_ppo starts); "
                "the examples' client: pip install 'pettingllms-verl[agents]'", signature,
            )
    if program.command:
        executable = program.command[0]
        if shutil.which(executable) is None and not os.path.isfile(executable):
            raise ConfigError(f"{SECTION}.program.command", f"{executable!r} is no executable on PATH nor a file here ({os.getcwd()})",
                              "give the command as a list: [program, args...]")
    roles = tuple(settings.roles)
    settings.check_roles("the program", roles, roles)
