"""The policy table: models, tokenizers, pools, roles against the environment, images, LoRA adapters."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

from omegaconf import DictConfig, OmegaConf

from pettingllms_verl.config import TRAINER_MODES
from pettingllms_verl.preflight.code import _check_program, _check_sandbox, _check_user_code
from pettingllms_verl.preflight.common import ConfigError, select, settings_error, where
from pettingllms_verl.preflight.paths import _check_model_path, _train_env
from pettingllms_verl.preflight.training import GROUPLESS

def _check_policies(config: DictConfig, settings: Any, views: Callable[[], list[tuple[str | None, DictConfig]]]) -> None:
    """The ``pettingllms`` section: schema, policies (models, tokenizers, pools), roles vs the env.
    ``views``: each worker group's config (``common.policy_views``), built when first called."""
    from pettingllms_verl import envs
    from pettingllms_verl.config import ADAPTER_GROUP, SECTION, SettingsError
    from pettingllms_verl.targets import TargetError

    prompts: Callable[[], dict[str, Any]] = dict  # role -> its first prompt's messages: the env's, where the rows name one
    try:
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
            prompts = functools.partial(_first_prompts, env, settings.workflow)
            if getattr(env, "image_roles", None):
                _check_image_roles(config, settings, sorted(env.image_roles), views())
    except SettingsError as error:
        raise settings_error(error) from None
    main_model = select(config, "actor_rollout_ref.model.path")
    paths = {}  # policy -> its model path
    for name, policy in table.items():
        key = f"{SECTION}.policies.{name}"
        path = OmegaConf.select(OmegaConf.create(policy.overrides), "model.path")
        if path is not None:
            _check_model_path(f"{key}.overrides.model.path", path)
        paths[name] = path or main_model
        if policy.pool == "own" and (policy.n_gpus_per_node == 0 or policy.nnodes == 0):
            raise ConfigError(f"{key}.n_gpus_per_node", "a pool of its own with no GPU", "give it at least one GPU, or pool: shared")
    if set(paths.values()) != {main_model}:  # some policy has a model of its own
        _check_families(config, settings, paths, prompts)
    _check_resumed_models(config, settings, paths)
    groups = settings.groups()
    if ADAPTER_GROUP in groups:
        _check_adapters(config, settings, groups)
    if len(table) > 1 and select(config, "algorithm.adv_estimator") not in GROUPLESS:
        raise ConfigError(
            "algorithm.adv_estimator", f"{select(config, 'algorithm.adv_estimator')!r} with several policies: its "
            "groups (one per problem) would mix rows of different policies", "use at_grpo (groups keyed by role) or gae",
        )
    if len(table) > 1 and select(config, "actor_rollout_ref.actor.checkpoint.async_save"):
        raise ConfigError(
            "actor_rollout_ref.actor.checkpoint.async_save", "asynchronous saves with several policies: the "
            "tracker file could name a step whose policies are still being written", "set it to false",
        )
    if len(table) > 1 and select(config, "trainer.v1.trainer_mode") not in TRAINER_MODES:
        raise ConfigError("trainer.v1.trainer_mode", f"{len(table)} policies need the multi-policy trainer",
                          f"set trainer.v1.trainer_mode to one of {', '.join(TRAINER_MODES)}")


def _check_image_roles(config: DictConfig, settings: Any, roles: list[str], views: list[tuple[str | None, DictConfig]]) -> None:
    """Roles shown images (the env option image_roles) need a vision-language model with its processor."""
    from transformers import AutoProcessor

    from pettingllms_verl.config import SECTION

    key = f"{SECTION}.env_kwargs.image_roles"
    table = settings.policy_table()

    def model_of(policy: str) -> tuple[str, Any]:
        """The policy's model path and its config (None where it does not load here: a hub model not
        cached, a folder without a config; the model path checks report what matters)."""
        path = OmegaConf.select(OmegaConf.create(table[policy].overrides), "model.path") or select(config, "actor_rollout_ref.model.path")
        return path, _model_config(path)

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
    for group, view in views:
        if select(view, "actor_rollout_ref.actor.use_prefix_grouper"):
            grouper = where(config, group, "actor.use_prefix_grouper")
            raise ConfigError(grouper, f"with image roles {roles}: the shared-prefix forward packs text rows only "
                              "(an image row's tokens come with its pixels and multimodal positions)", f"set {grouper}=false")


def _check_adapters(config: DictConfig, settings: Any, groups: dict[str, list[str]]) -> None:
    """LoRA adapters per role (L1): verl settings they need, their starting weights, and the base
    model's module names (targets must exist; peft finds an adapter's tensors by its name)."""
    from pettingllms_verl.config import ADAPTER_GROUP, SECTION, VLLM_PER_POLICY

    adapters = groups[ADAPTER_GROUP]
    if select(config, "actor_rollout_ref.model.lora.merge"):
        raise ConfigError(
            "actor_rollout_ref.model.lora.merge", f"true with {len(adapters)} adapters: verl merges the active "
            "adapter into the base for the rollout, which would then serve one role's weights to every role",
            "set actor_rollout_ref.model.lora.merge=false (each adapter is synced by name)",
        )
    if select(config, "actor_rollout_ref.model.lora_adapter_path"):
        raise ConfigError("actor_rollout_ref.model.lora_adapter_path", "verl's one adapter, with adapters per policy",
                          f"start an adapter from a folder with {SECTION}.policies.<name>.adapter.path instead")
    if select(config, "actor_rollout_ref.actor.strategy") not in ("fsdp2", None):
        raise ConfigError("actor_rollout_ref.actor.strategy", f"{select(config, 'actor_rollout_ref.actor.strategy')!r}: "
                          "several adapters on one base need FSDP2", "set actor_rollout_ref.actor.strategy=fsdp2")
    rollout = select(config, "actor_rollout_ref.rollout.name")
    if rollout not in ("hf", VLLM_PER_POLICY):
        raise ConfigError("actor_rollout_ref.rollout.name", f"{rollout!r} serves one LoRA adapter (verl 0.9.1)",
                          "use hf, or vllm_multilora (several adapters per vLLM server)")
    needs_ref = select(config, "actor_rollout_ref.actor.use_kl_loss") or select(config, "algorithm.use_kl_in_reward")
    if needs_ref and len(groups) > 1:
        raise ConfigError(
            "actor_rollout_ref.actor.use_kl_loss", "a reference model in a run that mixes adapter policies with "
            "full-model policies: the adapters' reference is their base with adapters off, the full models "
            "would have none", "turn the KL terms off, or make every policy an adapter (or every one a full model)",
        )
    modules = _modules(select(config, "actor_rollout_ref.model.path"))
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


def _first_prompts(env: Any, workflow: str) -> dict[str, Any]:
    """role -> the env's first messages for it. Asked only of a team of several model families: an
    env's observation may have effects (a fault on cue in the tests), which the run must not see twice.
    A role whose observation fails here (not its turn yet) is left to the episodes."""
    prompts = {}
    for role in env.workflow(workflow).turn_order:
        try:
            prompts[role] = env.observation(role)
        except Exception:
            continue
    return prompts


def _check_families(config: DictConfig, settings: Any, paths: dict[str, str], prompts: Callable[[], dict[str, Any]]) -> None:
    """Policies of several model families (tokenizers) in one run: what cannot mix is refused.
    ``paths``: policy -> its model path. The first group's tokenizer is verl's own (its agent-loop
    worker, its trainer's logs); a policy whose tokenizer differs renders and reads its own roles. An
    adapter never differs: it lives on the base model (an adapter's ``overrides.model`` is refused).
    ``prompts()``: role -> the env's first messages for it, which each role's policy must render."""
    from pettingllms_verl.config import SECTION

    first = settings.groups()[next(iter(settings.groups()))][0]  # verl's own group: its worker's tokenizer
    others = [name for name, path in paths.items() if not same_family(paths[first], path)]
    if not others:
        return
    table = settings.policy_table()
    for name in others:  # verl's worker builds every row's position ids with the first policy's processor
        if getattr(_model_config(paths[name]), "vision_config", None) is not None:
            raise ConfigError(f"{SECTION}.policies.{name}.overrides.model.path", f"{paths[name]} is a vision-language model of another "
                              f"family than the first policy, {first}: verl's episode worker builds every row's position ids with the first "
                              "policy's processor", "list the vision-language policy first, or give it a model of the first one's family")
    for role, messages in prompts().items():  # the other families' templates, on what the env asks their roles
        policy = settings.policy_of(role)
        if policy not in others:
            continue
        template = OmegaConf.select(OmegaConf.create(table[policy].overrides), "model.custom_chat_template")
        try:
            _tokenizer(paths[policy]).apply_chat_template(messages, add_generation_prompt=True, tokenize=False, chat_template=template)
        except Exception as error:  # a template that rejects a message role or shape of this env's prompts
            raise ConfigError(f"{SECTION}.policies.{policy}.overrides.model.path", f"{paths[policy]}'s chat template cannot render "
                              f"role {role}'s prompt: {error!r}", "give the role a policy whose template takes system and user messages, "
                              "or set the model's chat template (model.custom_chat_template)") from None
    what = f"policies {others} have another tokenizer than the first policy, {first} ({paths[first]})"
    for key in ("trainer.rollout_data_dir", "trainer.validation_data_dir"):
        if select(config, key):
            raise ConfigError(key, f"verl writes every row decoded by the first policy's tokenizer, and {what}",
                              f"unset it: {SECTION}.paths.episode_log_dir logs every episode with each role's text in its own policy's tokens")
    if (select(config, "trainer.log_val_generations") or 0) > 0:
        raise ConfigError("trainer.log_val_generations", f"verl decodes the logged generations with the first policy's tokenizer, and {what}",
                          f"set it to 0: {SECTION}.paths.episode_log_dir logs every episode with each role's own text")
    pair = settings.swap_policies or []
    if len(pair) == 2 and not same_family(paths[pair[0]], paths[pair[1]]) and not settings.swap_across_families:
        raise ConfigError(f"{SECTION}.swap_policies", f"{pair[0]} and {pair[1]} are of two model families ({what}): swapped, each "
                          "plays the other's role in its own chat template, a prompt it was never trained on",
                          f"set {SECTION}.swap_across_families=true to swap them anyway, or swap two policies of one family")
    seeing = [role for role in settings.env_kwargs.get("image_roles") or () if settings.policy_of(role) in others]
    if seeing:
        raise ConfigError(f"{SECTION}.env_kwargs.image_roles", f"roles {seeing} are shown images, and {what}: verl's episode worker "
                          "turns every image into model inputs with the first policy's processor", "give the roles that see a policy of the first one's family")


def _check_resumed_models(config: DictConfig, settings: Any, paths: dict[str, str]) -> None:
    """A run that resumes loads each worker group's weights from the step it resumes (a frozen policy's
    too): each must be the model its policy names now. Another architecture or tokenizer family fails
    in a worker after Ray started, or (the same shapes, another vocabulary) trains on tokens read as
    other text. ``paths``: policy -> its model path."""
    from pettingllms_verl.checkpoints import group_folder, resume_folder
    from pettingllms_verl.config import SECTION

    mode = select(config, "trainer.resume_mode") or "auto"  # verl's default
    try:
        step = resume_folder(mode, select(config, "trainer.resume_from_path"), select(config, "trainer.default_local_dir"))
    except ValueError as error:  # its message starts with the key
        raise ConfigError(str(error).split("=", 1)[0], str(error), "set trainer.resume_mode to auto, disable, or resume_path with "
                          "trainer.resume_from_path a global_step_N folder") from None
    if step is None:
        return
    table, groups = settings.policy_table(), settings.groups()
    for group, policies in groups.items():
        differ = saved_model_differs(group_folder(step, group, len(groups)), paths[policies[0]])
        if differ:
            override = OmegaConf.select(OmegaConf.create(table[policies[0]].overrides), "model.path") is not None
            raise ConfigError(
                f"{SECTION}.policies.{policies[0]}.overrides.model.path" if override else "actor_rollout_ref.model.path",
                f"the run resumes {step} (trainer.resume_mode={mode}), whose group {group!r} was trained from another model than "
                f"{paths[policies[0]]} ({differ})", "name the model that step was trained from, or start afresh: "
                "trainer.resume_mode=disable or another trainer.default_local_dir",
            )


def saved_model_differs(group_dir: str, model: str) -> str | None:
    """How the model a worker group's checkpoint (``group_dir``) was saved from differs from the model
    at ``model``, read from verl's copy of its config and tokenizer there (HF_DIR): the config fields
    of MODEL_FIELDS, or another tokenizer (model family) where it kept one; None where they agree,
    or where the checkpoint kept no config (an old or an archived one: the load itself tells). The
    sizes are read from each config's text model: verl saves a vision-language model's config as
    transformers loaded it, nested, where a model folder may hold the flat form."""
    from pettingllms_verl.checkpoints import HF_DIR, MODEL_FIELDS

    saved_dir, model = os.path.join(group_dir, HF_DIR), os.path.expanduser(model)
    if not os.path.isfile(os.path.join(saved_dir, "config.json")) or not os.path.isfile(os.path.join(model, "config.json")):
        return None
    saved, ours = _model_config(saved_dir), _model_config(model)
    if saved is None or ours is None:  # a config transformers cannot read here (custom code): the load itself tells
        return None

    def field(config: Any, name: str) -> Any:
        return config.model_type if name == "model_type" else getattr(config.get_text_config(), name, None)

    differ = {key: (field(saved, key), field(ours, key)) for key in MODEL_FIELDS if field(saved, key) != field(ours, key)}
    if differ:
        return ", ".join(f"{key}: {a} vs {b}" for key, (a, b) in differ.items())
    kept_tokenizer = any(os.path.isfile(os.path.join(saved_dir, name)) for name in ("tokenizer.json", "tokenizer_config.json"))
    return None if not kept_tokenizer or same_family(model, saved_dir) else "another tokenizer: another model family"


def _model_config(path: str) -> Any:
    """The model's config (None where it cannot be loaded here)."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(os.path.expanduser(path))
    except Exception:  # a hub model not cached: the model check above reports what matters
        return None


@functools.cache
def _tokenizer(path: str) -> Any:
    """The tokenizer of the model at ``path`` (None where it cannot be loaded here)."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(os.path.expanduser(path))
    except Exception:  # a hub model not cached: the model check above reports what matters
        return None


def same_family(first: str, other: str) -> bool:
    """Whether the model at ``other`` reads the token ids of the model at ``first`` as it does (the
    same tokenizer, or ``first``'s with image tokens ``other`` lacks); True where one cannot be loaded
    here (a hub model not cached: the model path checks report what matters)."""
    ours, theirs = _tokenizer_vocab(first), _tokenizer_vocab(other)
    return ours is None or theirs is None or _renders_for(ours, theirs)


@functools.cache
def _tokenizer_vocab(path: str) -> dict | None:
    """A tokenizer's vocabulary and special tokens (None where it cannot be loaded here)."""
    tokenizer = _tokenizer(path)
    return None if tokenizer is None else {"vocab": tokenizer.get_vocab(), "special": tokenizer.all_special_tokens}


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
