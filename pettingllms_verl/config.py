"""The ``pettingllms`` config section, as a typed schema (``OmegaConf.structured``): an unknown key
or a value of the wrong type fails by itself, naming the key.

```yaml
pettingllms:
  workflow: mas            # sa: one agent does everything | mas: every role of the env acts
  rollout_mode: tree       # tree: K branches per (turn, role) node | independent: plain episodes
  k: 4                     # branches per tree node (tree mode; use rollout.n=1)
  alpha: 1.0               # mixed reward = alpha * global (team) + local (role) reward
  env_kwargs: {}           # passed to pettingllms_verl.envs.make(name, **env_kwargs)
  envs:                    # your own environments: the rows' env name -> class, registered in every worker
    relay: relay_env.env:RelayEnv
  policies:                # name -> policy; none listed = one policy "shared" (L0)
    planner: {}                                          # actor_rollout_ref as configured
    solver: {overrides: {model: {path: /models/other}}, trainable: false}
  roles:                   # per role: which policy acts, and sampling overrides
    plan: {policy: planner, sampling: {temperature: 1.0, max_tokens: 48}, val_sampling: {}}
    tool: {policy: solver, reward: "my_pkg.rewards:tool_reward"}   # your function replaces the env's role reward
  paths:                   # where things are read and written
    artifacts: /data/pettingllms   # models, data and checkpoints (recipes interpolate ${pettingllms.paths.artifacts})
    batch_dump_dir: null           # set: each step's training rows as JSONL
    episode_log_dir: null          # set: every episode as JSONL, one file per rollout process
  trainer:                 # knobs of the mas_sync trainer
    mini_batches_per_step: null    # optimizer steps per policy per training step (null: verl's ppo_mini_batch_size rows each)
    replay_poll_interval_s: null   # how often verl's replay buffer polls for finished episodes (null: verl's 2 s)
    fault_budget: 0.5              # above this share of a step's episodes ended by a fault, the run stops
```
"""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

SECTION = "pettingllms"
DEFAULT_POLICY = "shared"  # the one policy of a run that lists none (L0)
ADAPTER_GROUP = "lora"  # the worker group of the adapter policies (L1): one base model, one adapter per policy
POLICY_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]*")  # a policy's name: its checkpoint folder and metric prefix
# where the adapter table travels to the trainer engine and the rollout (verl's free-form model.lora dict)
ADAPTERS_KEY = "pettingllms_adapters"
# The rollout whose vLLM servers are named per policy (backends/vllm_multilora.py): the adapters of
# L1, and each full model of L2 when the run asks for `vllm` (verl names vLLM server actors by
# replica rank alone, so two groups' replicas would take the same names).
VLLM_PER_POLICY = "vllm_multilora"
# The plugin's trainers (trainer.v1.trainer_mode) -> the verl schedule each runs: verl's own checks
# (replay buffer, refill, checkpointed in-flight episodes) and its trainer.v1.<mode> section read that.
TRAINER_MODES = {"mas_sync": "sync", "mas_colocate_async": "colocate_async", "mas_separate_async": "separate_async"}
# a training row's field (and tag): the temperature its reply was sampled at, which its log-probs use
ROW_TEMPERATURE = "mas_temperature"
# the smallest positive sampling temperature: below it vLLM samples greedily, and a row scored at it
# divides its logits into inf (1e-300 is 0 in float32); 0 is greedy
GREEDY_BELOW = 1e-5


def key(help: str, default: Any = None, factory: Any = None) -> Any:
    """A config key with its one-line help (the reference in docs/configuration.md is generated from it)."""
    if factory is not None:
        return field(default_factory=factory, metadata={"help": help})
    return field(default=default, metadata={"help": help})


class SettingsError(ValueError):
    """A bad value in the ``pettingllms`` section; the message starts with its full key."""


def check_temperature(key: str, temperature: Any) -> None:
    """A sampling temperature (None: unset) is 0 (greedy) or a finite number from ``GREEDY_BELOW``
    (a string is read as ``float`` reads it, as verl's config does; a bool is no temperature)."""
    if temperature is None:
        return
    try:
        value = math.nan if isinstance(temperature, bool) else float(temperature)
    except (TypeError, ValueError):
        value = math.nan
    if not (value == 0 or GREEDY_BELOW <= value < math.inf):
        raise SettingsError(f"{key}: {temperature!r}; 0 (greedy) or a finite number of at least {GREEDY_BELOW}")


@dataclass
class SamplingConfig:
    """Per-role overrides of verl's sampling params (unset = the rollout's own)."""

    temperature: float | None = key("sampling temperature of this role's replies")
    top_p: float | None = key("nucleus sampling threshold")
    top_k: int | None = key("top-k sampling (-1: off)")
    max_tokens: int | None = key("reply budget (capped by rollout.response_length)")
    stop: list[str] | None = key("stop strings")
    repetition_penalty: float | None = key("above 1 discourages repeats")

    def params(self) -> dict[str, Any]:
        return {key: value for key, value in vars(self).items() if value is not None}


# What shapes the sampling distribution; in validation verl's val_kwargs set these, not `sampling`.
DISTRIBUTION_KEYS = ("temperature", "top_p", "top_k")


@dataclass
class RoleConfig:
    policy: str | None = key("policy that acts for this role (a key of `policies`); default: the only policy")
    sampling: SamplingConfig = key("this role's sampling overrides in training", factory=SamplingConfig)
    val_sampling: SamplingConfig = key("this role's sampling overrides in validation (default: verl's val_kwargs; sampling's max_tokens/stop still apply)",
                                       factory=SamplingConfig)
    reward: str | None = key("your reward for this role's replies, 'module:function' or 'file.py:function': fn(role=, reply=, result=, env=) -> float "
                             "replaces the env's local reward")


@dataclass
class AdapterConfig:
    """A LoRA adapter on the run's base model (``actor_rollout_ref.model.path``), named after its policy."""

    rank: int = key("LoRA rank r", 8)
    alpha: int = key("LoRA alpha (the update is scaled by alpha / rank)", 16)
    target_modules: list[str] = key("module names to adapt, or [\"all-linear\"]", factory=lambda: ["all-linear"])
    path: str | None = key("start from this peft adapter folder (adapter_config.json + adapter_model.safetensors)")

    def lora_config(self) -> dict[str, Any]:
        """peft ``LoraConfig`` fields."""
        targets = list(self.target_modules)
        return {
            "r": self.rank, "lora_alpha": self.alpha, "bias": "none", "task_type": "CAUSAL_LM",
            "target_modules": "all-linear" if targets == ["all-linear"] else targets,
        }


@dataclass
class PolicyConfig:
    """One policy: a full model with its own trainer worker group and rollout replicas (L2), or a
    LoRA adapter on the run's base model, sharing one worker group with the other adapters (L1)."""

    overrides: dict[str, Any] = key("merged into actor_rollout_ref for this policy (model.path, actor.optim.lr, rollout.gpu_memory_utilization, ...)",
                                    factory=dict)
    trainable: bool = key("false: it generates but is never updated (a frozen role)", True)
    pool: str = key("shared: colocated on the trainer's GPUs (trainer.n_gpus_per_node x nnodes) | own: GPUs of its own", "shared")
    n_gpus_per_node: int | None = key("pool=own: GPUs per node of its pool (default trainer.n_gpus_per_node)")
    nnodes: int | None = key("pool=own: nodes of its pool (default trainer.nnodes)")
    adapter: AdapterConfig | None = key("set: this policy is a LoRA adapter on actor_rollout_ref's model (L1)")
    max_staleness: int | None = key("asynchronous trainers: the most weight pushes behind this policy's newest its role's replies in an "
                                    "episode may be for that episode's rows to train it (0: only the weights it trains); older rows keep "
                                    "their groups whole but are not trained; null: verl's bound (trainer.v1.sampler.max_off_policy_threshold - 1)")

    def own_pool(self, trainer_gpus_per_node: int, trainer_nnodes: int) -> list[int]:
        """GPUs per node of this policy's own pool (verl's resource-pool spec); [] on the shared pool."""
        if self.pool != "own":
            return []
        return [self.n_gpus_per_node or trainer_gpus_per_node] * (self.nnodes or trainer_nnodes)

    def rollout_temperature(self) -> Any:
        """``overrides.rollout.temperature`` as written (None: unset), the one place it is read."""
        return self.overrides.get("rollout", {}).get("temperature")


@dataclass
class PathsConfig:
    """``pettingllms.paths``: where things are read and written."""

    artifacts: str | None = key("where `make` puts models, data and checkpoints (recipes interpolate it)")
    batch_dump_dir: str | None = key("if set, each step's training rows are written there as JSONL")
    episode_log_dir: str | None = key("if set, every episode (training and validation) is appended there as JSONL: prompts, replies, rewards, tree branches")


@dataclass
class TrainerConfig:
    """``pettingllms.trainer``: knobs of the mas_sync trainer."""

    mini_batches_per_step: int | None = key("optimizer steps per policy per training step, whatever the row count (null: verl's ppo_mini_batch_size rows each)")
    replay_poll_interval_s: float | None = key("how often verl's replay buffer polls for finished episodes (verl: 2 s)")
    fault_budget: float = key("largest share of a training step's (or a validation pass's) episodes that may end by a fault (engine_error, env_error) before "
                              "the run stops; a dead engine stops it always", 0.5)
    null_reward: str | None = key("permute: the null-training control, each reply's reward shuffled among the replies of its AT-GRPO group before its "
                                  "advantage (the same replies, steps and advantage scale, no information on which reply earned it); null: off")


@dataclass
class ProgramConfig:
    """``pettingllms.program``: a team written as a program that speaks the OpenAI API (docs/agent-programs.md).
    Each of its calls names an agent in ``model``; the agents are the recipe's ``roles``."""

    target: str | None = key("the team program, 'module:function' or 'file.py:function' (sync or async): fn(task, client) -> reward; run in a process of its "
                             "own per episode")
    command: list[str] | None = key("or a command (any language): reads OPENAI_BASE_URL, OPENAI_API_KEY and PETTINGLLMS_TASK_FILE (the task, a JSON file) "
                                    "from its environment, prints its reward as the last line")
    reward: str | None = key("optional 'module:function': fn(task=, transcript=, output=) -> reward (any form a program may return), over the recorded calls "
                             "(replaces what the program returns)")
    success_at: float = key("an episode counts as solved when its team reward (or the mean of its agents' rewards) reaches this, unless the program returns "
                            "its own success", 1.0)
    time_limit_s: float = key("wall time a program run may take; past it its processes are killed and the episode is lost (program_timeout), or rewarded "
                              "limit_reward", 300.0)
    max_calls: int = key("most model calls one program run may make (all agents together); one more loses the episode (program_call_limit), or rewards it "
                         "limit_reward", 64)
    limit_reward: float | None = key("the reward of every call of a run stopped at max_calls or time_limit_s: it trains as a truncated episode "
                                     "(program_limit, never a success), as an environment's out of turns does; null: such a run is a fault, its episode lost")
    max_parallel_runs: int = key("program runs alive at once per rollout worker (agent.num_workers of them: the machine's bound is the product); each run is "
                                 "a process, ~30 MB and up; the others wait their turn before their time limit starts", 64)
    host: str = key("the interface the gateway listens on (loopback unless you need the program elsewhere)", "127.0.0.1")
    max_request_bytes: int = key("largest request body the gateway accepts", 4 * 1024 * 1024)

    @property
    def enabled(self) -> bool:
        return bool(self.target or self.command)


# keys that moved out of the top level of the section: old key -> its sub-section
MOVED_KEYS = {
    "artifacts": "paths",
    "batch_dump_dir": "paths",
    "episode_log_dir": "paths",
    "mini_batches_per_step": "trainer",
    "replay_poll_interval_s": "trainer",
}


GROUP_PARTS = ("turn", "role", "node")  # AT-GRPO's group key beside the problem, in key order
NULL_REWARD_PERMUTE = "permute"  # trainer.null_reward: the null-training control


@dataclass
class PettingLLMsConfig:
    workflow: str = key("sa: one agent does everything | mas: every role of the env acts, in turn order", "mas")
    rollout_mode: str = key("tree: K branches per (turn, role) node | independent: plain episodes (rollout.n of them)", "tree")
    k: int = key("branches per tree node", 4)
    alpha: float = key("mixed reward = alpha * team reward + role reward", 1.0)
    group_by: list[str] = key("parts of a reply's GRPO group key beside its problem (turn, role, tree node); [] groups by problem alone (the "
                              "credit-assignment ablation)", factory=lambda: list(GROUP_PARTS))
    env_kwargs: dict[str, Any] = key("the environment's options: pettingllms_verl.envs.make(name, **env_kwargs)", factory=dict)
    envs: dict[str, str] = key("your environments: name -> 'module:Class' (or 'file.py:Class'), registered in every rollout worker; rows name them in "
                               "extra_info.env", factory=dict)
    roles: dict[str, RoleConfig] = key("per role: policy and sampling overrides", factory=dict)
    policies: dict[str, PolicyConfig] = key("name -> policy (a name: letters, digits, _ and -; it names the checkpoint folder and metrics); empty: one policy "
                                            "\"shared\"", factory=dict)
    swap_policies: list[str] | None = key("two policy names: validation also runs with each one's roles served by the other (metrics under swap/)")
    swap_across_families: bool = key("allow swap_policies between two policies of different model families (each then plays the other's role in "
                                      "its own chat template)", False)
    paths: PathsConfig = key("where models, data, checkpoints and logs go", factory=PathsConfig)
    trainer: TrainerConfig = key("knobs of the mas_sync trainer", factory=TrainerConfig)
    program: ProgramConfig = key("a team program in place of the rows' environment (its agents: the roles)", factory=ProgramConfig)

    def role(self, name: str) -> RoleConfig:
        return self.roles.get(name) or RoleConfig()

    def sampling_overrides(self, role: str, validate: bool) -> dict[str, Any]:
        """The role's overrides of verl's sampling params: in validation, val_kwargs keep the
        sampling distribution (greedy validation stays greedy) unless ``val_sampling`` says otherwise.
        In training a role samples at its own ``sampling.temperature``, else at its policy's
        ``overrides.rollout.temperature`` (the temperature that policy's group trains at), else at
        the rollout's; every reply is trained at the temperature it was sampled at (``mas_temperature``)."""
        config = self.role(role)
        overrides = config.sampling.params()
        policy_temperature = self.policy_table()[self.policy_of(role)].rollout_temperature()
        if policy_temperature is not None:
            overrides.setdefault("temperature", float(policy_temperature))
        if validate:
            overrides = {key: value for key, value in overrides.items() if key not in DISTRIBUTION_KEYS}
            overrides.update(config.val_sampling.params())
        return overrides

    def branches(self, validate: bool) -> int:
        """K for a node: validation and independent rollouts never branch."""
        return 1 if validate or self.rollout_mode == "independent" else self.k

    def policy_table(self) -> dict[str, PolicyConfig]:
        """policy name -> policy; L0 (none configured) is the table of one default policy."""
        return dict(self.policies) or {DEFAULT_POLICY: PolicyConfig()}

    def groups(self) -> dict[str, list[str]]:
        """worker group -> its policies. The adapter policies share the group ``lora`` (the first
        group: verl's own actor, on the base model); every other policy is a group of its own."""
        table = self.policy_table()
        adapters = [name for name, policy in table.items() if policy.adapter is not None]
        groups = {ADAPTER_GROUP: adapters} if adapters else {}
        groups.update({name: [name] for name, policy in table.items() if policy.adapter is None})
        return groups

    def adapter_table(self, names: list[str]) -> dict[str, dict[str, Any]]:
        """The adapters of ``names`` as the engine and the rollout read them (``model.lora.pettingllms_adapters``)."""
        table = self.policy_table()
        return {
            name: {**table[name].adapter.lora_config(), "path": table[name].adapter.path, "trainable": table[name].trainable}
            for name in names
        }

    def policy_of(self, role: str, swapped: bool = False) -> str:
        """The policy that acts for ``role`` (with ``swapped``: under the swapped-policy switch)."""
        table = self.policy_table()
        name = self.role(role).policy
        if name is None:
            if len(table) > 1:
                raise SettingsError(f"{SECTION}.roles.{role}.policy: not set, and there are several policies {sorted(table)}")
            name = next(iter(table))
        if swapped and self.swap_policies and name in self.swap_policies:
            a, b = self.swap_policies
            name = b if name == a else a
        return name

    def validate(self) -> None:
        if self.workflow not in ("sa", "mas"):
            raise SettingsError(f"{SECTION}.workflow: {self.workflow!r} is not 'sa' or 'mas'")
        if self.rollout_mode not in ("tree", "independent"):
            raise SettingsError(f"{SECTION}.rollout_mode: {self.rollout_mode!r} is not 'tree' or 'independent'")
        if any(part not in GROUP_PARTS for part in self.group_by) or len(set(self.group_by)) != len(self.group_by):
            raise SettingsError(f"{SECTION}.group_by: {list(self.group_by)}; use each of {list(GROUP_PARTS)} at most once")
        if self.k < 1:
            raise SettingsError(f"{SECTION}.k: {self.k} branches per node; need at least 1")
        mini_batches = self.trainer.mini_batches_per_step
        if mini_batches is not None and mini_batches < 1:
            raise SettingsError(f"{SECTION}.trainer.mini_batches_per_step: {mini_batches}; need at least 1 (or null)")
        if self.program.target and self.program.command:
            raise SettingsError(f"{SECTION}.program.command: a program is a target or a command, not both; drop one")
        if self.program.enabled and not self.roles:
            raise SettingsError(f"{SECTION}.roles: a program's agents are the roles its calls name in `model`; list them (e.g. "
                                f"{SECTION}.roles.planner.policy=...)")
        for name in ("time_limit_s", "max_calls", "max_parallel_runs"):
            if getattr(self.program, name) <= 0:
                raise SettingsError(f"{SECTION}.program.{name}: {getattr(self.program, name)}; must be positive")
        if self.program.limit_reward is not None and not math.isfinite(self.program.limit_reward):
            raise SettingsError(f"{SECTION}.program.limit_reward: {self.program.limit_reward}; a finite reward (e.g. -1.0), or null")
        if self.trainer.null_reward not in (None, NULL_REWARD_PERMUTE):
            raise SettingsError(f"{SECTION}.trainer.null_reward: {self.trainer.null_reward!r}; {NULL_REWARD_PERMUTE!r} (the control) or null")
        if not 0.0 <= self.trainer.fault_budget <= 1.0:
            raise SettingsError(f"{SECTION}.trainer.fault_budget: {self.trainer.fault_budget}; a share of episodes, in [0, 1]")
        table = self.policy_table()
        for name, policy in table.items():
            key = f"{SECTION}.policies.{name}"
            if not POLICY_NAME.fullmatch(name):
                raise SettingsError(f"{key}: the name {name!r} names the policy's checkpoint folder and its metrics (policy/<name>/...); "
                                    "use letters, digits, '_' and '-' (not first)")
            if policy.pool not in ("shared", "own"):
                raise SettingsError(f"{key}.pool: {policy.pool!r} is not 'shared' or 'own'")
            if policy.pool == "shared" and (policy.n_gpus_per_node is not None or policy.nnodes is not None):
                raise SettingsError(f"{key}.n_gpus_per_node: only for pool=own (a shared policy uses the trainer's GPUs)")
            if policy.adapter is not None:
                self._validate_adapter(key, name, policy)
            if policy.max_staleness is not None and (policy.max_staleness < 0 or not policy.trainable):
                raise SettingsError(f"{key}.max_staleness: {policy.max_staleness}; " + (
                    "a frozen policy (trainable: false) learns from no reply; drop it" if policy.trainable is False
                    else "pushes behind: 0 or more"))
            unknown = set(policy.overrides) - {"model", "actor", "ref", "rollout"}
            if unknown:
                raise SettingsError(f"{key}.overrides: unknown sections {sorted(unknown)}; allowed: model, actor, ref, rollout")
            for section, value in policy.overrides.items():
                if not isinstance(value, Mapping):
                    raise SettingsError(f"{key}.overrides.{section}: {value!r}; a mapping of verl's keys under {section}")
            check_temperature(f"{key}.overrides.rollout.temperature", policy.rollout_temperature())
        adapters = self.groups().get(ADAPTER_GROUP, [])
        for name in adapters:
            # peft picks an adapter's tensors by substring: `plan` would also take `plan_v2`'s
            clash = next((other for other in adapters if other != name and name in other), None)
            if clash is not None:
                raise SettingsError(
                    f"{SECTION}.policies.{name}.adapter: adapter names collide ({name!r} is part of {clash!r}, and peft "
                    "finds an adapter's tensors by its name); rename one of the two policies"
                )
        if adapters and ADAPTER_GROUP in table:
            raise SettingsError(f"{SECTION}.policies.{ADAPTER_GROUP}: the adapters' worker group is named so; rename this policy")
        for role, config in self.roles.items():
            if config.policy is not None and config.policy not in table:
                raise SettingsError(
                    f"{SECTION}.roles.{role}.policy: unknown policy {config.policy!r}; defined: {sorted(table)} "
                    f"(add it under {SECTION}.policies)"
                )
            for part in ("sampling", "val_sampling"):
                check_temperature(f"{SECTION}.roles.{role}.{part}.temperature", getattr(config, part).temperature)
        if self.swap_policies is not None:
            if len(self.swap_policies) != 2 or len(set(self.swap_policies)) != 2:
                raise SettingsError(f"{SECTION}.swap_policies: {self.swap_policies}; give two different policy names")
            missing = [name for name in self.swap_policies if name not in table]
            if missing:
                raise SettingsError(f"{SECTION}.swap_policies: unknown policies {missing}; defined: {sorted(table)}")

    @staticmethod
    def _validate_adapter(key: str, name: str, policy: PolicyConfig) -> None:
        # peft finds an adapter's tensors by its name inside parameter names (`lora_A.<name>.weight`)
        if not name.isidentifier() or name in ("default", ADAPTER_GROUP) or name in "lora_A lora_B base_layer lora_embedding_A weight bias":
            raise SettingsError(
                f"{key}.adapter: the adapter takes its policy's name {name!r}, which collides with peft's own names; "
                "rename the policy (a Python identifier other than default, lora, or a part of lora_A/lora_B/base_layer)"
            )
        if policy.pool != "shared" or policy.overrides.get("model"):
            what = "a pool of its own" if policy.pool != "shared" else "overrides.model"
            raise SettingsError(
                f"{key}.adapter: an adapter lives on the run's base model (actor_rollout_ref.model) in the trainer's "
                f"worker group, so it cannot have {what}; drop it, or make {name} a full model (no adapter)"
            )
        if policy.overrides:
            raise SettingsError(
                f"{key}.overrides: adapters share one worker group and its actor_rollout_ref settings; "
                "set them there (or make this policy a full model without adapter)"
            )
        if policy.adapter.rank < 1 or policy.adapter.alpha < 1:
            raise SettingsError(f"{key}.adapter.rank: rank {policy.adapter.rank}, alpha {policy.adapter.alpha}; both must be >= 1")
        if not policy.adapter.target_modules:
            raise SettingsError(f"{key}.adapter.target_modules: empty; name modules (e.g. [q_proj, v_proj]) or [all-linear]")

    def check_roles(self, env_name: str, env_roles: tuple[str, ...], acting: tuple[str, ...]) -> None:
        """Roles against the environment: ``env_roles`` it has, ``acting`` the workflow's turn order."""
        for role in self.roles:
            if role not in env_roles:
                raise SettingsError(f"{SECTION}.roles.{role}: {env_name} has no role {role!r}; its roles: {list(env_roles)}")
        used = {self.policy_of(role) for role in acting}
        unused = sorted(set(self.policy_table()) - used)
        if unused:
            raise SettingsError(
                f"{SECTION}.policies.{unused[0]}: no acting role uses it (acting roles of {env_name}: {list(acting)}); "
                f"map a role to it under {SECTION}.roles or remove it"
            )


def load(section: Any) -> PettingLLMsConfig:
    """The validated section (``None``: all defaults); ``SettingsError`` names the bad key."""
    schema = OmegaConf.structured(PettingLLMsConfig)
    if section is not None and hasattr(section, "keys"):
        for key in section.keys():
            if key in MOVED_KEYS:
                raise SettingsError(f"{SECTION}.{key}: moved to {SECTION}.{MOVED_KEYS[key]}.{key}")
    try:
        if isinstance(section, DictConfig):  # resolved where it lives: its paths point into the whole config (${pettingllms.paths.artifacts}/...)
            section = OmegaConf.to_container(section, resolve=True)
        merged = OmegaConf.merge(schema, section if section is not None else {})
        settings: PettingLLMsConfig = OmegaConf.to_object(merged)
    except OmegaConfBaseException as error:
        key = getattr(error, "full_key", None) or ""
        raise SettingsError(f"{SECTION}.{key}: {str(error).splitlines()[0]}") from None
    settings.validate()
    return settings


def policy_config(config: DictConfig, group: str) -> DictConfig:
    """The whole trainer config as worker group ``group`` sees it (see ``groups``): a full policy's
    ``overrides`` merged into ``actor_rollout_ref``; for the adapter group, verl's LoRA path switched
    on (``model.lora_rank``) and the adapter table in ``model.lora.pettingllms_adapters``; the group's
    name in ``rollout.custom.policy`` (rollout servers are named by it), and vLLM servers named per
    policy where several groups ask for ``vllm``."""
    settings = load(config.get(SECTION))
    out = copy.deepcopy(config)
    with open_dict(out):
        if group == ADAPTER_GROUP:
            adapters = settings.adapter_table(settings.groups()[ADAPTER_GROUP])
            model = out.actor_rollout_ref.model
            # verl's engine and trainer treat lora_rank > 0 as "LoRA model" (reference = adapters off);
            # the adapters themselves are built from the table
            model.lora_rank = max(adapter["r"] for adapter in adapters.values())
            model.lora = {**(model.get("lora") or {}), ADAPTERS_KEY: adapters}
        else:
            out.actor_rollout_ref = OmegaConf.merge(out.actor_rollout_ref, settings.policy_table()[group].overrides)
            if len(settings.groups()) > 1 and out.actor_rollout_ref.rollout.name == "vllm":
                out.actor_rollout_ref.rollout.name = VLLM_PER_POLICY
        out.actor_rollout_ref.rollout.custom = {**(out.actor_rollout_ref.rollout.get("custom") or {}), "policy": group}
    return out


def adapter_table(model_config: Any) -> dict[str, dict[str, Any]]:
    """The adapters a (trainer or rollout) model config carries: name -> LoraConfig fields + path, trainable."""
    lora = model_config.get("lora") if isinstance(model_config, (dict, DictConfig)) else getattr(model_config, "lora", None)
    table = (lora or {}).get(ADAPTERS_KEY) or {}
    return {name: dict(OmegaConf.to_container(spec) if isinstance(spec, DictConfig) else spec) for name, spec in table.items()}


def rollout_policy(rollout_config: Any) -> str:
    """The policy a rollout config serves (``rollout.custom.policy``; the default policy if unset)."""
    custom = rollout_config.get("custom") if isinstance(rollout_config, DictConfig) else getattr(rollout_config, "custom", None)
    return str((custom or {}).get("policy") or DEFAULT_POLICY)
