"""The trainer, its estimator and sampling: names verl looks up, modes, settings that disagree, the null-training control, a temperature per role."""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from pettingllms_verl.config import SECTION, TRAINER_MODES
from pettingllms_verl.preflight.common import ConfigError, needs_critic, select, where

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
    value = select(config, key)
    if value is not None and str(value) not in names:
        raise ConfigError(key, f"unknown name {value!r}", f"use one of: {', '.join(names)}")


def _check_trainer_mode(config: DictConfig) -> None:
    """verl's asynchronous modes asked for by their verl names, or one the plugin does not run: the
    multi-agent rows need the plugin's trainer of that mode (docs/async.md)."""
    mode = select(config, "trainer.v1.trainer_mode")
    if mode in ("colocate_async", "separate_async"):
        raise ConfigError("trainer.v1.trainer_mode", f"{mode!r} is verl's trainer of one policy over single-agent rows",
                          f"set trainer.v1.trainer_mode=mas_{mode} (the same schedule over the team's policies)")


def _check_separate_async(config: DictConfig, settings: Any) -> None:
    """``mas_separate_async``: each policy's rollout on a pool of its own, weights pushed by a
    checkpoint engine; what it does not run yet is refused here rather than deep in a worker."""
    if select(config, "trainer.v1.trainer_mode") != "mas_separate_async":
        return
    fix = "or use trainer.v1.trainer_mode=mas_colocate_async"
    if select(config, "actor_rollout_ref.hybrid_engine") is not False:
        raise ConfigError("actor_rollout_ref.hybrid_engine", "mas_separate_async serves every episode from each policy's "
                          "own rollout pool, with no replicas in the trainer's processes", "set actor_rollout_ref.hybrid_engine=false")
    for key in ("actor_rollout_ref.rollout.nnodes", "actor_rollout_ref.rollout.n_gpus_per_node"):
        if int(select(config, key) or 0) < 1:
            raise ConfigError(key, f"{select(config, key)}: each policy's rollout pool needs a size",
                              f"set {key}=1 (or more; on CPU these are Ray slots, not devices)")
    backend = select(config, "actor_rollout_ref.rollout.checkpoint_engine.backend")
    if backend in (None, "naive"):
        raise ConfigError("actor_rollout_ref.rollout.checkpoint_engine.backend", f"{backend!r} syncs a rollout in the trainer's "
                          "own processes; mas_separate_async pushes weights to another pool",
                          "set it to gloo (any machine) or one of verl's nccl, nixl, mooncake")
    sync_step = int(select(config, "trainer.v1.separate_async.parameter_sync_step") or 1)
    batch = int(select(config, "data.train_batch_size") or 0)
    if sync_step < 1 or batch % sync_step:
        raise ConfigError("trainer.v1.separate_async.parameter_sync_step", f"{sync_step} does not divide data.train_batch_size={batch} "
                          "(each push follows that many updates, each on an equal share of the step's problems)",
                          "use a divisor of data.train_batch_size")
    if select(config, "trainer.v1.separate_async.hybrid_rollout.enable_switch"):
        raise ConfigError("trainer.v1.separate_async.hybrid_rollout.enable_switch", "lends the trainer's devices to the rollout "
                          "between steps; mas_separate_async has no rollout replicas there", "set it to false")
    for key in ("actor_rollout_ref.actor.use_kl_loss", "algorithm.use_kl_in_reward"):
        if select(config, key):
            raise ConfigError(key, "a reference model is not yet built beside mas_separate_async's trainer", f"set {key}=false, {fix}")
    if needs_critic(config):
        raise ConfigError("algorithm.adv_estimator", "a critic is not yet built beside mas_separate_async's trainer",
                          f"use a critic-free estimator (at_grpo, grpo, rloo, reinforce_plus_plus), {fix}")


def _check_staleness_bounds(config: DictConfig, settings: Any) -> None:
    """A policy's own staleness bound (``max_staleness``) needs a trainer that trains older replies,
    and bites only below verl's bound (which drops a problem past it)."""
    bounded = {name: policy.max_staleness for name, policy in settings.policy_table().items() if policy.max_staleness is not None}
    if not bounded:
        return
    name, bound = next(iter(bounded.items()))
    key = f"{SECTION}.policies.{name}.max_staleness"
    mode = select(config, "trainer.v1.trainer_mode")
    if TRAINER_MODES.get(mode, "sync") == "sync":
        raise ConfigError(key, f"{bound} with trainer.v1.trainer_mode={mode}: a synchronous trainer trains only replies of the "
                          "weights it trains", "set trainer.v1.trainer_mode=mas_colocate_async or mas_separate_async, or drop it")
    threshold = select(config, "trainer.v1.sampler.max_off_policy_threshold")
    strategy = select(config, "trainer.v1.sampler.max_off_policy_strategy") or "drop"
    over = {name: b for name, b in bounded.items() if threshold is not None and strategy == "drop" and b >= int(threshold) - 1}
    if over:
        name, bound = next(iter(over.items()))
        raise ConfigError(f"{SECTION}.policies.{name}.max_staleness", f"{bound} is not below verl's bound: "
                          f"trainer.v1.sampler.max_off_policy_threshold={threshold} already trains nothing older than "
                          f"{int(threshold) - 1} pushes behind", f"lower it below {int(threshold) - 1}, or drop it")


MAS_MANAGER = "pettingllms_verl.rollout.worker.MASAgentLoopManager"


# verl's estimators the mas_sync trainer runs on per-turn team rows (docs/training.md says what each does)
TEAM_ESTIMATORS = ("at_grpo", "grpo", "rloo", "reinforce_plus_plus", "gae")


GROUPLESS = ("at_grpo", "gae")  # no group spans two policies: at_grpo keys its groups by role, gae has none


def _check_team_estimator(config: DictConfig, settings: Any) -> None:
    """An estimator the mas_sync trainer cannot train with, refused with the reason."""
    from pettingllms_verl.config import ADAPTER_GROUP

    estimator = select(config, "algorithm.adv_estimator")
    key = "algorithm.adv_estimator"
    if estimator not in TEAM_ESTIMATORS:
        raise ConfigError(key, f"{estimator!r} with the mas_sync trainer: it has not been run on per-turn team rows "
                          "(some need fields or generations these rows do not have)", f"use one of {TEAM_ESTIMATORS}")
    critic = needs_critic(config)
    if critic and estimator != "gae":
        raise ConfigError("critic.enable", f"a critic with {estimator!r}: no advantage would read its values",
                          "set algorithm.adv_estimator=gae, or critic.enable=false")
    if estimator == "gae" and not critic and not select(config, "trainer.val_only"):
        raise ConfigError("critic.enable", "false with gae: GAE's advantages are returns minus the critic's values",
                          "set critic.enable=true, or another estimator")
    if critic and settings is not None and ADAPTER_GROUP in settings.groups():
        raise ConfigError(
            "critic.enable", "a critic with LoRA-adapter policies: verl's value model is a model of its own with one "
            "value head, and a value head per adapter would need a multi-adapter critic (docs/training.md)",
            "give the roles full-model policies (a critic each) or one shared policy, or use at_grpo",
        )
    if estimator not in GROUPLESS and select(config, "pettingllms.rollout_mode") in (None, "tree"):
        raise ConfigError(
            key, f"{estimator!r} with tree sampling: a tree is one episode per problem, so every row would get the same "
            "return and the K branches of a node would not be told apart (only at_grpo groups by node, and gae "
            "values each row on its own)",
            "set pettingllms.rollout_mode=independent with actor_rollout_ref.rollout.n > 1, or use at_grpo",
        )


def _check_null_reward(config: DictConfig) -> None:
    """The null-training control shuffles rewards within AT-GRPO groups: refused where it has no
    such group to shuffle in (another estimator, or one reply per group)."""
    if select(config, "pettingllms.trainer.null_reward") is None:
        return
    key = "pettingllms.trainer.null_reward"
    estimator = select(config, "algorithm.adv_estimator")
    if estimator != "at_grpo":
        raise ConfigError(key, f"the control with algorithm.adv_estimator={estimator!r}: it shuffles rewards within AT-GRPO's groups",
                          "set algorithm.adv_estimator=at_grpo, or pettingllms.trainer.null_reward=null")
    tree = select(config, "pettingllms.rollout_mode") in (None, "tree")
    what = "pettingllms.k" if tree else "actor_rollout_ref.rollout.n"
    replies = select(config, what) or (4 if tree else 1)
    if int(replies) < 2:
        raise ConfigError(key, f"the control with {what}={replies}: every group holds one reply, so shuffling its rewards "
                          "changes nothing and the run would train on the reward as it is", f"set {what} to 2 or more")


def _temperature_apart(config: DictConfig, settings: Any) -> tuple[str, float, float] | None:
    """(key, temperature, the rollout's) of the first role or policy that trains at another temperature
    than ``rollout.temperature`` (greedy counts as 1, as the rollouts score it), or None."""
    scored = lambda t: float(t) if float(t) > 0 else 1.0  # noqa: E731
    rollout = select(config, "actor_rollout_ref.rollout.temperature")
    rollout = scored(1.0 if rollout is None else rollout)
    for role, role_config in settings.roles.items():
        if role_config.sampling.temperature is not None and scored(role_config.sampling.temperature) != rollout:
            return f"pettingllms.roles.{role}.sampling.temperature", role_config.sampling.temperature, rollout
    for name, policy in settings.policies.items():
        temperature = OmegaConf.select(OmegaConf.create(policy.overrides), "rollout.temperature")
        if temperature is not None and scored(temperature) != rollout:
            return f"pettingllms.policies.{name}.overrides.rollout.temperature", temperature, rollout
    return None


def _check_one_temperature(config: DictConfig, mas: bool, views: list[tuple[str | None, DictConfig]], settings: Any) -> None:
    """A role trained at its own temperature needs the mas_sync trainer on verl's FSDP engine without
    fused kernels, in every worker group (``views``): only there is each row scored at its own
    (``trainer/shared_prefix.py``)."""
    apart = _temperature_apart(config, settings)
    if apart is None:
        return
    key, temperature, rollout = apart
    problem = f"{temperature} with rollout.temperature={rollout}"
    if not mas:
        raise ConfigError(key, f"{problem} outside the mas_sync trainer: verl would score these replies at the "
                          "rollout's temperature", "set trainer.v1.trainer_mode=mas_sync, or sample at the rollout's temperature")
    for group, view in views:
        strategy = select(view, "actor_rollout_ref.actor.strategy")
        if strategy not in (None, "fsdp", "fsdp2"):  # None: verl's default, fsdp
            raise ConfigError(key, f"{temperature} with {where(config, group, 'actor.strategy')}={strategy}: only the FSDP "
                              "engine scores each row at its own temperature", "use fsdp2, or one temperature")
    if select(config, "actor_rollout_ref.model.use_fused_kernels"):
        raise ConfigError(key, f"{problem} with model.use_fused_kernels: verl's fused kernels take one temperature "
                          "per batch", "set actor_rollout_ref.model.use_fused_kernels=false, or one temperature")


def _check_agreement(config: DictConfig, settings: Any) -> None:
    """Settings that each look fine but disagree with another one (silently wrong training)."""
    mas = select(config, "trainer.v1.trainer_mode") in TRAINER_MODES
    if select(config, "algorithm.adv_estimator") == "at_grpo" and not mas:
        raise ConfigError(
            "algorithm.adv_estimator", "at_grpo outside the mas_sync trainer would train every row on its "
            "episode's final reward, grouped by problem", "set trainer.v1.trainer_mode=mas_sync (or mas_colocate_async)",
        )
    if mas:
        manager = select(config, "actor_rollout_ref.rollout.agent.agent_loop_manager_class")
        if manager != MAS_MANAGER:
            raise ConfigError(
                "actor_rollout_ref.rollout.agent.agent_loop_manager_class", f"{manager!r}: the mas_sync trainer needs "
                "the multi-agent manager (validation episodes are told apart from training ones there)",
                f"set it to {MAS_MANAGER}",
            )
        _check_team_estimator(config, settings)
        n = int(select(config, "actor_rollout_ref.rollout.n") or 1)
        if select(config, "pettingllms.rollout_mode") in (None, "tree") and n > 1:
            raise ConfigError(
                "actor_rollout_ref.rollout.n", f"{n} with tree sampling: each of the n copies of a problem grows its "
                "own tree, splitting identical root prompts into n groups", "set actor_rollout_ref.rollout.n=1 "
                "(pettingllms.k sets the branches) or pettingllms.rollout_mode=independent",
            )
        if select(config, "reward.reward_model.enable"):
            raise ConfigError(
                "reward.reward_model.enable", "a reward model would overwrite the environments' per-sample rewards",
                "set reward.reward_model.enable=false (the environments score every reply)",
            )
