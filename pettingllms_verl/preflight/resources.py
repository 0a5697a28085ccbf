"""What the run needs of the machine or cluster: Ray GPU slots, peak memory on CPU, joining a running cluster."""

from __future__ import annotations

import os
from typing import Any

from omegaconf import DictConfig

from pettingllms_verl import memory
from pettingllms_verl.preflight.common import ConfigError, joins_cluster, parse, policy_views, select

def _gpus_needed(config: DictConfig, settings: Any) -> tuple[int, str]:
    """Ray GPU slots the run asks for, and the key that adds the last of them."""
    per_node, nodes = int(select(config, "trainer.n_gpus_per_node") or 0), int(select(config, "trainer.nnodes") or 1)
    needed, key = per_node * nodes, "trainer.n_gpus_per_node"
    for name, policy in (settings.policy_table().items() if settings is not None else ()):
        if policy.pool == "own":
            needed += sum(policy.own_pool(per_node, nodes))
            key = f"pettingllms.policies.{name}.n_gpus_per_node"
    if settings is not None and select(config, "trainer.v1.trainer_mode") == "mas_separate_async":  # each group's standalone rollout pool
        rollout = int(select(config, "actor_rollout_ref.rollout.n_gpus_per_node") or 0) * int(select(config, "actor_rollout_ref.rollout.nnodes") or 0)
        needed += rollout * len(settings.groups())
        key = "actor_rollout_ref.rollout.n_gpus_per_node"
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
    train = int(select(config, "data.train_batch_size") or 1) * int(select(config, "actor_rollout_ref.rollout.n") or 1) * branches(False)
    validates = select(config, "trainer.val_only") or select(config, "trainer.val_before_train") or (select(config, "trainer.test_freq") or -1) > 0
    val_files = select(config, "data.val_files")
    if not validates or not val_files:
        return train
    problems = _parquet_rows(val_files) or 1
    for cap in (select(config, "data.val_batch_size"), select(config, "data.val_max_samples")):
        if cap is not None and int(cap) > 0:
            problems = min(problems, int(cap))
    return max(train, problems * int(select(config, "actor_rollout_ref.rollout.val_kwargs.n") or 1) * branches(True))


def _gpu_visible() -> bool:
    import torch

    return torch.cuda.is_available()


def _check_cluster(config: DictConfig) -> None:
    """Ray refuses ``num_cpus``/``num_gpus`` in ``ray.init`` when it joins a running cluster (the CPU recipes set both)."""
    address = joins_cluster(config)
    if address is None:
        return
    for key in ("num_cpus", "num_gpus"):
        if select(config, f"ray_kwargs.ray_init.{key}") is not None:
            raise ConfigError(
                f"ray_kwargs.ray_init.{key}", f"set while joining the Ray cluster at {address}, which Ray refuses "
                "(a running cluster's resources are what `ray start` declared on each node)",
                f"remove it: '~ray_kwargs.ray_init.{key}' (on CPU, give each node its trainer slots with `ray start --num-gpus=N`)",
            )


def estimate_memory(config: DictConfig, settings: Any = ..., views: list[tuple[str | None, DictConfig]] | None = None) -> memory.Estimate | None:
    """On CPU with the hf rollout, the run's peak memory (``memory.py``): per worker group, its
    replicas' servers at their busiest and its policy's copies, and the processes. None elsewhere
    (a GPU, vLLM's own KV cache, a model not readable here). ``views``: each worker group's config, where
    the caller built them (``common.policy_views``)."""
    from pettingllms_verl.config import ADAPTER_GROUP

    if select(config, "trainer.device") != "cpu" or joins_cluster(config) or _gpu_visible():
        return None  # a GPU's memory (verl moves a CPU recipe onto a visible GPU), or nodes this machine cannot see
    settings = parse(config) if settings is ... else settings  # ...: read here (a caller of its own, not check)
    table = settings.policy_table() if settings is not None else {}
    per_node, nodes = int(select(config, "trainer.n_gpus_per_node") or 1), int(select(config, "trainer.nnodes") or 1)
    episodes = _episodes_at_once(config, settings)
    fixed, per_row, rows, processes = 0, 0, 1, memory.FIXED_PROCESSES
    for group, view in views if views is not None else policy_views(config, settings):
        rollout = view.actor_rollout_ref.rollout
        if rollout.name != "hf":
            return None  # vLLM sizes its own KV cache (VLLM_CPU_KVCACHE_SPACE)
        try:
            model = memory.ModelSize.of(os.path.expanduser(str(view.actor_rollout_ref.model.path)))
        except Exception:  # a model not readable here: the model checks say what matters
            return None
        policy = table.get(group)
        replicas = sum(policy.own_pool(per_node, nodes)) if policy is not None and policy.pool == "own" else per_node * nodes
        prompt = int(select(view, "actor_rollout_ref.rollout.prompt_length") or select(view, "data.max_prompt_length") or 0)
        reply = int(select(view, "actor_rollout_ref.rollout.response_length") or select(view, "data.max_response_length") or 0)
        adapters = group == ADAPTER_GROUP
        reference = not adapters and bool(select(view, "actor_rollout_ref.actor.use_kl_loss") or select(view, "algorithm.use_kl_in_reward"))
        # the hf engine folds each adapter into a copy of its layers' weights unless told not to (CPU default)
        merge = select(view, "actor_rollout_ref.rollout.engine_kwargs.hf.merge_adapters")
        folded = len(settings.groups()[group]) if adapters and (merge is None or bool(merge)) else 0
        fixed += replicas * memory.server_bytes(model, 0, prompt, reply, folded)
        fixed += memory.trainer_bytes(model, trainable=not adapters and (policy is None or policy.trainable), reference=reference)
        per_row += replicas * (2 * prompt + reply) * model.kv_bytes_per_token
        rows = max(rows, memory.rows_at_once(episodes, replicas, int(rollout.get("max_num_seqs") or 64)))
        processes += 2 * replicas  # a trainer rank and a server per replica
    processes += int(select(config, "actor_rollout_ref.rollout.agent.num_workers") or 1)
    return memory.Estimate(fixed + processes * memory.PROCESS_BYTES, per_row, rows, prompt, reply)


def check_memory(config: DictConfig, machine: int, settings: Any = ..., views: list[tuple[str | None, DictConfig]] | None = None) -> None:
    """``estimate_memory`` against ``machine`` bytes: a setting that cannot fit is refused here,
    not killed by Ray's memory monitor mid-run."""
    estimate = estimate_memory(config, settings, views)
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


def _check_gpu_slots(config: DictConfig, settings: Any) -> None:
    """Ray GPU slots (``ray_kwargs.ray_init.num_gpus``) for every trainer rank and policy pool."""
    needed, key = _gpus_needed(config, settings)
    declared = select(config, "ray_kwargs.ray_init.num_gpus")
    if declared is not None and int(declared) < needed:
        raise ConfigError(
            "ray_kwargs.ray_init.num_gpus",
            f"{declared} Ray GPU slots for {needed} ranks (trainer.n_gpus_per_node x trainer.nnodes + policy pools)",
            f"set ray_kwargs.ray_init.num_gpus={needed} (on CPU these are slots, not devices) or lower {key}",
        )
