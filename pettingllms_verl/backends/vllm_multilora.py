"""The ``vllm_multilora`` rollout: ``actor_rollout_ref.rollout.name=vllm_multilora``. One vLLM server
holds the base model and every adapter of ``actor_rollout_ref.model.lora.pettingllms_adapters``
(one LoRA adapter per policy); a request picks its adapter with ``generate(..., adapter=<name>)``.

Run by the vLLM tier on vLLM's CPU build (`make test-vllm`: tests/vllm_tier/test_vllm_l1.py), which
checks each request's adapter, each adapter's weight version and the rollout-actor log-prob gap.

Built as subclasses of verl's own vLLM classes, with verl unchanged. verl serves exactly one
adapter, under the fixed id ``VLLM_LORA_INT_ID`` (``vllm_rollout/utils.py``), and forces
``max_loras=1`` after the user's engine kwargs (``vllm_async_server.py`` ``launch_server``). Here:
- ``MultiLoRAHttpServer`` (``vLLMHttpServer``): rewrites the parsed vLLM args to hold every adapter,
  attaches each request's ``LoRARequest``, and stamps each reply with the adapter that served it and
  that adapter's weight version.
- ``MultiLoRAWorkerExtension`` (verl's worker extension, inside vLLM's worker processes): an adapter
  sync replaces that adapter's own id, not verl's fixed one.
- ``MultiLoRAReplica`` (``vLLMReplica``): starts those servers, named per policy.
- ``MultiLoRAServerAdapter`` (verl's vLLM ``ServerAdapter``, trainer-worker side): finds this policy's
  server and versions each adapter separately.

The classes are built on first access (module ``__getattr__``), so this module imports without
vLLM while vLLM and Ray still find them by dotted name (``worker_extension_cls``, verl's rollout
registry, pickling by reference).
"""

from __future__ import annotations

import contextvars
import functools
import json
import os
from contextlib import contextmanager
from typing import Any
from collections.abc import Iterable, Iterator

from pettingllms_verl.config import ADAPTERS_KEY, VLLM_PER_POLICY, adapter_table, rollout_policy

ROLLOUT_NAME = VLLM_PER_POLICY
SERVER_ADAPTER = f"{__name__}.MultiLoRAServerAdapter"
WORKER_EXTENSION = f"{__name__}.MultiLoRAWorkerExtension"
# The server hands its adapter table to vLLM's worker processes (which inherit its environment,
# as verl's own VERL_REPLICA_RANK does), so both sides derive the same int ids.
TABLE_ENV = "PETTINGLLMS_VLLM_LORA_ADAPTERS"
# vLLM loads an adapter it does not hold from its request's path; an adapter with no folder is only
# ever pushed by the trainer, and a request before that push fails naming this path.
UNSYNCED_PATH = "pettingllms-adapter-not-synced-yet"

# The adapter of the request being served (set around verl's generate, read by the engine wrapper).
_REQUEST_LORA: contextvars.ContextVar[Any] = contextvars.ContextVar("pettingllms_request_lora", default=None)


def lora_int_id(name: str, names: Iterable[str]) -> int:
    """vLLM's id for adapter ``name``: 1-based rank in sorted order, so the server and vLLM's
    worker processes agree without talking, whatever order the table was written in."""
    ids = {adapter: index for index, adapter in enumerate(sorted(names), start=1)}
    if name not in ids:
        raise KeyError(f"{ROLLOUT_NAME}: unknown adapter {name!r}; adapters of this server: {sorted(ids)}")
    return ids[name]


def server_engine_overrides(table: dict[str, dict[str, Any]], max_lora_rank: int | None = None) -> dict[str, Any]:
    """The vLLM engine args that keep every adapter resident (GPU and CPU slots for all); none
    without adapters (a full-model policy). ``max_lora_rank``: the one asked for in
    ``rollout.engine_kwargs.vllm`` (the preflight checks it holds every adapter), else the largest
    rank, before verl's rounding up to a rank vLLM accepts."""
    if not table:
        return {}
    return {
        "enable_lora": True,
        "max_loras": len(table),
        "max_cpu_loras": len(table),
        "max_lora_rank": max_lora_rank or max(spec["r"] for spec in table.values()),
    }


def lora_request_fields(adapter: str, table: dict[str, dict[str, Any]]) -> tuple[str, int, str]:
    """``(lora_name, lora_int_id, lora_path)`` of vLLM's ``LoRARequest`` for ``adapter``."""
    if adapter not in table:
        raise KeyError(
            f"{ROLLOUT_NAME}: unknown adapter {adapter!r}; this server holds {sorted(table) or 'no adapters'} "
            f"(actor_rollout_ref.model.lora.{ADAPTERS_KEY})"
        )
    return adapter, lora_int_id(adapter, table), table[adapter]["path"] or UNSYNCED_PATH


def sync_adapter(peft_config: Any, base_sync_done: bool, lora_name: str | None, table: dict[str, dict[str, Any]]) -> str | None:
    """The adapter a weight sync carries, None for the base model (verl's own test for an adapter
    sync: ``peft_config and base_sync_done``). Checked before any tensor is sent: a receiver that
    fails before it starts would leave the sender waiting."""
    if not (peft_config and base_sync_done):
        return None
    if lora_name is None:
        raise ValueError(f"{ROLLOUT_NAME}: an adapter sync must name its adapter (update_weights(..., lora_name=...))")
    lora_request_fields(lora_name, table)
    return lora_name


def server_name_prefix(policy: str) -> str:
    """Ray actor names ``<prefix>server_<replica>_<node>``: per policy, since every policy's worker
    group numbers its replicas from 0."""
    return f"{ROLLOUT_NAME}_{policy}_"


@contextmanager
def request_lora(lora_request: Any) -> Iterator[None]:
    """Serve the enclosed ``generate`` with ``lora_request`` (None: the base); per asyncio task."""
    token = _REQUEST_LORA.set(lora_request)
    try:
        yield
    finally:
        _REQUEST_LORA.reset(token)


class PerRequestLoRAEngine:
    """vLLM's engine as verl's ``generate`` calls it, with the request's own adapter in place of
    the one verl attaches (its fixed id, or none); everything else passes through."""

    def __init__(self, engine: Any):
        self._engine = engine

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def generate(self, *args: Any, lora_request: Any = None, **kwargs: Any) -> Any:
        return self._engine.generate(*args, lora_request=_REQUEST_LORA.get(), **kwargs)


def _named(cls: type) -> type:
    """Give a class built in a function the dotted name this module's ``__getattr__`` serves."""
    cls.__qualname__ = cls.__name__
    return cls


def _require_vllm() -> None:
    """A plain ImportError: without vLLM, verl's vLLM modules fail with a ValueError about versions."""
    import vllm  # noqa: F401


def _table_from_env() -> dict[str, dict[str, Any]]:
    if TABLE_ENV not in os.environ:
        raise RuntimeError(f"{ROLLOUT_NAME}: {TABLE_ENV} is unset; this worker was not started by MultiLoRAHttpServer")
    return json.loads(os.environ[TABLE_ENV])


@functools.cache
def _worker_extension() -> type:
    _require_vllm()
    from verl.utils.vllm import TensorLoRARequest
    from verl.workers.rollout.vllm_rollout.utils import vLLMColocateWorkerExtension

    class MultiLoRAWorkerExtension(vLLMColocateWorkerExtension):
        """verl's extension with one id per adapter. vLLM rejects an extension attribute its worker
        already has, so new state lives on the instance (``_pettingllms_lora``), not the class."""

        def update_weights_from_ipc(
            self, peft_config: dict | None = None, base_sync_done: bool = False, use_shm: bool = False,
            lora_name: str | None = None,
        ) -> None:
            table = _table_from_env()
            adapter = sync_adapter(peft_config, base_sync_done, lora_name, table)
            if adapter is not None:
                self._pettingllms_lora = lora_request_fields(adapter, table)
                # Drop this adapter's previous weights; verl's own removal (of its fixed id) is a no-op.
                self.remove_lora(self._pettingllms_lora[1])
            super().update_weights_from_ipc(peft_config, base_sync_done, use_shm)

        def _update_weights(self, weights: list, peft_config: dict | None, base_sync_done: bool) -> None:
            if peft_config and base_sync_done:
                name, lora_id, path = self._pettingllms_lora
                # Cloned as verl does: add_lora keeps them past the reused IPC buffer (verl #6454).
                tensors = {key: tensor.clone() for key, tensor in weights}
                self.add_lora(TensorLoRARequest(
                    lora_name=name, lora_int_id=lora_id, lora_path=path, peft_config=peft_config, lora_tensors=tensors
                ))
                return
            # The base model. With LoRA enabled vLLM wraps the adapted layers (``.base_layer``);
            # verl maps names onto them only when given a peft config (utils.py, _update_weights),
            # which its own base sync always passes and ours (peft_config=None) does not.
            super()._update_weights(weights, {} if peft_config is None else peft_config, base_sync_done)

    return _named(MultiLoRAWorkerExtension)


@functools.cache
def _http_server() -> type:
    _require_vllm()
    from vllm.lora.request import LoRARequest

    from verl.workers.rollout.replica import TokenOutput
    from verl.workers.rollout.vllm_rollout.utils import get_vllm_max_lora_rank
    from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer

    class MultiLoRAHttpServer(vLLMHttpServer):
        """verl's vLLM server with every adapter of the table resident."""

        def __init__(self, config: Any, model_config: Any, *args: Any, **kwargs: Any):
            self.adapters = adapter_table(model_config)
            self.adapter_steps: dict[str, int | None] = {name: None for name in self.adapters}
            os.environ[TABLE_ENV] = json.dumps(self.adapters)  # before launch_server starts vLLM's processes
            super().__init__(config, model_config, *args, **kwargs)
            self.policy = rollout_policy(self.config)

        def _get_worker_extension_cls(self) -> str:
            return WORKER_EXTENSION

        def _with_adapters(self, args: Any) -> Any:
            """Applied to the parsed args: verl sets ``max_loras=1`` and its own ``max_lora_rank``
            after the engine kwargs, so they cannot set these (vllm_async_server.py, launch_server)."""
            asked = (self.config.get("engine_kwargs", {}).get("vllm") or {}).get("max_lora_rank")
            overrides = server_engine_overrides(self.adapters, asked)
            if overrides:
                overrides["max_lora_rank"] = get_vllm_max_lora_rank(overrides["max_lora_rank"])
            vars(args).update(overrides)
            return args

        async def run_server(self, args: Any) -> None:
            await super().run_server(self._with_adapters(args))
            self.engine = PerRequestLoRAEngine(self.engine)

        async def run_headless(self, args: Any) -> None:
            await super().run_headless(self._with_adapters(args))

        async def generate(
            self, prompt_ids: list[int], sampling_params: dict[str, Any], request_id: str, adapter: str | None = None,
            **kwargs: Any,
        ) -> TokenOutput:
            """verl's generate on ``adapter`` (None: the base); the reply names who served it and
            the version of those weights."""
            lora = None
            if adapter is not None:
                name, lora_id, path = lora_request_fields(adapter, self.adapters)
                lora = LoRARequest(lora_name=name, lora_int_id=lora_id, lora_path=path)
            with request_lora(lora):
                output = await super().generate(prompt_ids, sampling_params, request_id, **kwargs)
            output.extra_fields["policy"] = self.policy if adapter is None else adapter
            output.extra_fields["global_steps"] = self.global_steps if adapter is None else self.adapter_steps[adapter]
            return output

        async def set_global_steps(self, global_steps: int, adapter: str | None = None) -> None:
            if adapter is None:
                self.global_steps = global_steps
                return
            lora_request_fields(adapter, self.adapters)
            self.adapter_steps[adapter] = global_steps

    return _named(MultiLoRAHttpServer)


@functools.cache
def _replica() -> type:
    _require_vllm()
    import ray

    from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMReplica

    server_class = _http_server()

    class MultiLoRAReplica(vLLMReplica):
        """verl's vLLM replica, starting ``MultiLoRAHttpServer`` actors named per policy."""

        def __init__(self, *args: Any, **kwargs: Any):
            super().__init__(*args, **kwargs)
            self.server_class = ray.remote(server_class)

        def _get_server_name_prefix(self) -> str:
            return server_name_prefix(rollout_policy(self.config))

    return _named(MultiLoRAReplica)


@functools.cache
def _server_adapter() -> type:
    _require_vllm()
    from verl.workers.rollout.vllm_rollout.vllm_rollout import ServerAdapter

    class MultiLoRAServerAdapter(ServerAdapter):
        """verl's vLLM adapter. verl's finds its server by ``rollout.name`` alone and sets one
        weight version per server (vllm_rollout.py, _get_server_name_prefix, update_weights)."""

        def _get_server_name_prefix(self) -> str:
            return server_name_prefix(rollout_policy(self.config))

        async def update_weights(
            self, weights: Any, global_steps: int | None = None, wire_format: str = "named_tensors", **kwargs: Any
        ) -> None:
            adapter = sync_adapter(
                kwargs.get("peft_config"), kwargs.get("base_sync_done", False), kwargs.get("lora_name"),
                adapter_table(self.model_config),
            )
            await super().update_weights(weights, global_steps=None, wire_format=wire_format, **kwargs)
            if global_steps is not None and self._ensure_server_handle():
                await self.server_handle.set_global_steps.remote(global_steps, adapter=adapter)

    return _named(MultiLoRAServerAdapter)


_LAZY = {
    "MultiLoRAWorkerExtension": _worker_extension,
    "MultiLoRAHttpServer": _http_server,
    "MultiLoRAReplica": _replica,
    "MultiLoRAServerAdapter": _server_adapter,
}


def __getattr__(name: str) -> type:
    if name in _LAZY:
        return _LAZY[name]()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def load_replica_class() -> type:
    """verl's replica class for ``vllm_multilora`` (imports vLLM)."""
    return _replica()


def register() -> None:
    """Register with verl (idempotent: both registries are plain dicts that take the entry again)."""
    from verl.workers.rollout.base import _ROLLOUT_REGISTRY
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    RolloutReplicaRegistry.register(ROLLOUT_NAME, load_replica_class)
    _ROLLOUT_REGISTRY[(ROLLOUT_NAME, "async")] = SERVER_ADAPTER
