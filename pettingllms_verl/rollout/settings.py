"""The ``pettingllms`` config section: how episodes are rolled out (validated, with clear errors).

```yaml
pettingllms:
  workflow: mas            # sa: one agent does everything | mas: every role of the env acts
  rollout_mode: tree       # tree: K branches per (turn, role) node | independent: plain episodes
  k: 4                     # branches per tree node (tree mode; use rollout.n=1)
  alpha: 1.0               # mixed reward = alpha * global (team) + local (role) reward
  env_kwargs: {}           # passed to pettingllms_verl.envs.make(name, **env_kwargs)
  roles:                   # per role: which policy acts, and sampling overrides
    plan: {policy: shared, sampling: {temperature: 1.0, max_tokens: 48, stop: []}}
  batch_dump_dir: null     # if set, the mas_sync trainer writes each step's training rows there
  replay_poll_interval_s: null  # mas_sync: how often verl's replay buffer polls for finished episodes (verl: 2 s)
```
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from omegaconf import OmegaConf

# Keys of the section read elsewhere: `artifacts` by recipes; `batch_dump_dir` and
# `replay_poll_interval_s` by the mas_sync trainer.
SECTION_KEYS = (
    "workflow", "rollout_mode", "k", "alpha", "env_kwargs", "roles", "artifacts", "batch_dump_dir", "replay_poll_interval_s"
)
SAMPLING_KEYS = ("temperature", "top_p", "top_k", "max_tokens", "stop", "repetition_penalty")


class SettingsError(ValueError):
    pass


@dataclass(frozen=True)
class RoleSettings:
    policy: str = "shared"  # name of the policy that acts for this role
    sampling: Mapping[str, Any] = field(default_factory=dict)  # overrides of verl's sampling params


@dataclass(frozen=True)
class RolloutSettings:
    workflow: str = "mas"
    rollout_mode: str = "tree"
    k: int = 4
    alpha: float = 1.0
    env_kwargs: Mapping[str, Any] = field(default_factory=dict)
    roles: Mapping[str, RoleSettings] = field(default_factory=dict)

    def role(self, name: str) -> RoleSettings:
        return self.roles.get(name, RoleSettings())

    def branches(self, validate: bool) -> int:
        """K for a node: validation and independent rollouts never branch."""
        return 1 if validate or self.rollout_mode == "independent" else self.k

    @classmethod
    def from_config(cls, section: Any) -> RolloutSettings:
        raw = OmegaConf.to_container(section, resolve=True) if section is not None else {}
        unknown = set(raw) - set(SECTION_KEYS)
        if unknown:
            raise SettingsError(f"pettingllms: unknown keys {sorted(unknown)}; allowed: {SECTION_KEYS}")
        settings = cls(
            workflow=str(raw.get("workflow", "mas")),
            rollout_mode=str(raw.get("rollout_mode", "tree")),
            k=int(raw.get("k", 4)),
            alpha=float(raw.get("alpha", 1.0)),
            env_kwargs=dict(raw.get("env_kwargs") or {}),
            roles={
                name: RoleSettings(policy=str(role.get("policy", "shared")), sampling=dict(role.get("sampling") or {}))
                for name, role in (raw.get("roles") or {}).items()
            },
        )
        settings.validate()
        return settings

    def validate(self) -> None:
        if self.workflow not in ("sa", "mas"):
            raise SettingsError(f"pettingllms.workflow: {self.workflow!r} is not 'sa' or 'mas'")
        if self.rollout_mode not in ("tree", "independent"):
            raise SettingsError(f"pettingllms.rollout_mode: {self.rollout_mode!r} is not 'tree' or 'independent'")
        if self.k < 1:
            raise SettingsError(f"pettingllms.k: {self.k} branches per node; need at least 1")
        for name, role in self.roles.items():
            unknown = set(role.sampling) - set(SAMPLING_KEYS)
            if unknown:
                raise SettingsError(
                    f"pettingllms.roles.{name}.sampling: unknown keys {sorted(unknown)}; allowed: {SAMPLING_KEYS}"
                )
