"""Configs that pass the plugin's checks before Ray (``preflight.check``), built from a few keys:
the tests change one key and expect the refusal that names it."""

from omegaconf import OmegaConf


def config(tmp_path, **overrides):
    """The smallest config the checks accept (an empty model folder and data file), with dotted ``overrides``."""
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    train = tmp_path / "train.parquet"
    train.write_bytes(b"")
    base = {
        "actor_rollout_ref": {"model": {"path": str(model)}, "rollout": {"name": "hf"}},
        "data": {"train_files": str(train), "val_files": [str(train)]},
        "trainer": {"n_gpus_per_node": 1, "nnodes": 1},
        "ray_kwargs": {"ray_init": {"num_gpus": 1}},
    }
    return OmegaConf.merge(base, OmegaConf.from_dotlist([f"{k}={v}" for k, v in overrides.items()]))


def two_policies(tmp_path, rows, **overrides):
    """A valid L2 config on Plan-Path rows: tool and plan, each its own policy."""
    base = {
        "data.train_files": rows,
        "pettingllms.policies.a.trainable": "true",
        "pettingllms.policies.b.trainable": "false",
        "pettingllms.roles.tool.policy": "a",
        "pettingllms.roles.plan.policy": "b",
    }
    return mas_config(tmp_path, **{**base, **overrides})


def two_adapters(tmp_path, rows, model, tool="tool_adapter", **overrides):
    """A valid L1 config on Plan-Path rows: a LoRA adapter per role on the tiny model, one frozen."""
    base = {
        "data.train_files": rows,
        "actor_rollout_ref.model.path": model,
        "actor_rollout_ref.actor.strategy": "fsdp2",
        "actor_rollout_ref.model.override_config.attn_implementation": "sdpa",  # as the CPU recipes: no flash-attn here
        f"pettingllms.policies.{tool}.adapter.rank": 8,
        "pettingllms.policies.plan_adapter.adapter.target_modules": "[q_proj,v_proj]",
        "pettingllms.policies.plan_adapter.trainable": "false",
        "pettingllms.roles.tool.policy": tool,
        "pettingllms.roles.plan.policy": "plan_adapter",
    }
    return mas_config(tmp_path, **{**base, **overrides})


def mas_config(tmp_path, **overrides):
    """A valid multi-agent config: the mas_sync trainer, its manager, a tree with rollout.n=1."""
    base = {
        "trainer.v1.trainer_mode": "mas_sync",
        "algorithm.adv_estimator": "at_grpo",
        "actor_rollout_ref.rollout.agent.agent_loop_manager_class": "pettingllms_verl.rollout.worker.MASAgentLoopManager",
        "actor_rollout_ref.rollout.n": 1,
        "pettingllms.rollout_mode": "tree",
    }
    return config(tmp_path, **{**base, **overrides})
