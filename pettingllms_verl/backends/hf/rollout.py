"""The ``hf`` rollout for verl: ``actor_rollout_ref.rollout.name=hf``.

Three pieces, as verl's vLLM/SGLang rollouts have:
- ``HFRolloutServer``: a Ray actor holding a copy of the policy in an ``HFGenerationEngine``.
  Concurrent ``generate`` calls are queued and served in batches (one ``model.generate`` per
  batch of compatible requests), not one at a time.
- ``HFRolloutReplica`` (driver side, registered in ``RolloutReplicaRegistry``): starts one server
  per replica.
- ``HFServerAdapter`` (trainer-worker side, registered in verl's ``_ROLLOUT_REGISTRY``): forwards
  sleep/wake and pushes the trainer's weights to its server after every update, so the rollout
  after update t samples from the weights after update t.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any
from collections.abc import Generator

import ray
import torch

from verl.plugin.platform import get_platform
from verl.utils.torch_dtypes import PrecisionType
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutReplica, TokenOutput
from verl.workers.rollout.utils import ensure_async_iterator

from pettingllms_verl.backends.cpu import usable_cores
from pettingllms_verl.backends.hf import attention
from pettingllms_verl.backends.hf.engine import HFGenerationEngine, SamplingSpec
from pettingllms_verl.config import rollout_policy
from pettingllms_verl.lora_names import split_pushed

logger = logging.getLogger(__name__)

ROLLOUT_NAME = "hf"
# The batcher starts a generate call once no further request has come for a quiet gap:
# BATCH_WAIT_FRACTION of the last call's duration, within [BATCH_WINDOW_S, BATCH_MAX_GAP_S] (the most
# until a call has been timed). Requests that trickle in (episodes starting one after another, each
# plan request after its tool program ran in the sandbox) so share one call instead of splitting the
# episodes into cohorts that stay out of step for the rest of the batch, and a lone request waits a
# small share of its own call. The first pending request waits at most BATCH_MAX_WAIT_S in all.
BATCH_WINDOW_S = 0.005
BATCH_WAIT_FRACTION = 0.05
BATCH_MAX_GAP_S = 0.25
BATCH_MAX_WAIT_S = 1.0


def quiet_gap(last_call_s: float | None) -> float:
    """Seconds without a new request after which the batcher starts a generate call."""
    if last_call_s is None:
        return BATCH_MAX_GAP_S
    return min(max(BATCH_WINDOW_S, BATCH_WAIT_FRACTION * last_call_s), BATCH_MAX_GAP_S)


def _engine_kwargs(rollout_config: Any) -> dict:
    """``actor_rollout_ref.rollout.engine_kwargs.hf``: ``torch_threads`` (CPU, default 1) and
    ``merge_adapters`` (a call of one LoRA adapter on weights with it folded in; default: on CPU only)."""
    return dict((rollout_config.engine_kwargs or {}).get(ROLLOUT_NAME) or {})


def server_actor_name(replica_rank: int, policy: str) -> str:
    """Named per policy: each policy's worker group numbers its replicas from 0."""
    return f"hf_server_{policy}_{replica_rank}_0"


def _torch_dtype(name: str, device: str) -> torch.dtype:
    """``rollout.dtype`` on CUDA; fp32 on CPU, where bf16 matmuls are slow and drift from the fp32 actor."""
    return torch.float32 if device == "cpu" else PrecisionType.to_dtype(name)


def server_options(
    replica_rank: int, policy: str, max_concurrency: int, node_id: str | None, device_id: str | None, noset_envvars: list[str]
) -> dict:
    """Ray options for one server actor: on the node of the trainer worker it serves (``node_id``;
    None: anywhere), sharing that worker's accelerator ``device_id`` (None on CPU).

    On a cluster of several nodes this keeps each policy's server beside its pool. The server asks
    Ray for no GPU (the trainer worker holds it; asking would wait forever). Ray hides every device
    from such an actor (CUDA_VISIBLE_DEVICES=""), so the NOSET variables stop Ray from touching it
    and the worker's device is set at process start, before anything in the process can initialise CUDA.
    """
    options: dict[str, Any] = dict(
        name=server_actor_name(replica_rank, policy), max_concurrency=max_concurrency, num_cpus=0, num_gpus=0
    )
    if node_id is not None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        options.update(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False))
    if device_id is not None:
        options.update(runtime_env={"env_vars": {**{var: "1" for var in noset_envvars}, "CUDA_VISIBLE_DEVICES": device_id}})
    return options


def claim_device(device: str, rollout_config: Any) -> str:
    """Set this process up for ``device`` ("cpu" or "cuda"); a CUDA server that sees no device is an error."""
    if device == "cpu":
        # Trainer, agent-loop and rollout processes share the cores: one thread each (the default)
        # avoids OpenMP oversubscription, which made decoding ~30x slower on 2 cores where runs
        # overlap; a run alone may give the server every core (recipes/base/cpu_one_run.yaml), and
        # never more threads than the cores this process may use.
        torch.set_num_threads(max(1, min(int(_engine_kwargs(rollout_config).get("torch_threads", 1)), usable_cores())))
        return device
    if not torch.cuda.is_available():
        raise RuntimeError(
            f"hf rollout: the trainer runs on {device} but this rollout server sees no CUDA device "
            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}); "
            "refusing to fall back to CPU silently"
        )
    return device


class HFRolloutServer:
    """Token-in/token-out server over one model copy (the methods verl's replica/client call)."""

    def __init__(self, rollout_config: Any, model_config: Any, replica_rank: int, device: str = "cpu"):
        from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText, AutoProcessor, AutoTokenizer

        from verl.utils.fs import copy_to_local

        device = claim_device(device, rollout_config)
        # The replica passes the raw `actor_rollout_ref.model` DictConfig (paths not yet localised).
        path = copy_to_local(model_config.get("local_path") or model_config.get("path"))
        tokenizer_path = copy_to_local(model_config.get("tokenizer_path") or path)
        trust_remote_code = bool(model_config.get("trust_remote_code", False))
        dtype = _torch_dtype(str(rollout_config.dtype), device)
        # a vision-language model (a vision_config) answers prompts with images, through its processor
        vision = getattr(AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code), "vision_config", None) is not None
        model = (AutoModelForImageTextToText if vision else AutoModelForCausalLM).from_pretrained(
            path,
            dtype=dtype,
            attn_implementation=attention.register() if device == "cpu" else "sdpa",
            trust_remote_code=trust_remote_code,
        ).to(device)
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_path, trust_remote_code=trust_remote_code)
        self.image_processor = AutoProcessor.from_pretrained(tokenizer_path, trust_remote_code=trust_remote_code).image_processor if vision else None
        print(f"hf rollout server {replica_rank}: model on {device} ({dtype}), {path}", flush=True)
        torch.manual_seed(int(rollout_config.seed) + replica_rank)
        # folded adapters cost a copy of the adapted weights per adapter (the CPU memory check counts it):
        # the default on CPU, where the decode loop's adapter matmuls cost ~10 % of generation; the
        # engine folds fp32 weights only, so a bf16 CUDA rollout keeps peft's forward
        merge_adapters = bool(_engine_kwargs(rollout_config).get("merge_adapters", device == "cpu"))
        self.engine = HFGenerationEngine(
            model, tokenizer, max_batch_size=int(rollout_config.max_num_seqs or 64), merge_adapters=merge_adapters
        )
        self.device = device
        self.dtype = dtype
        # verl sleeps the replica every step but wakes it only when free_cache_engine is set.
        self.offload_when_asleep = device == "cuda" and bool(rollout_config.free_cache_engine)
        self.prompt_length = int(rollout_config.prompt_length)
        self.response_length = int(rollout_config.response_length)
        self.policy = rollout_policy(rollout_config)  # stamped on every reply: which policy served it
        self.global_steps: int | None = None
        self.adapter_steps: dict[str, int | None] = {}  # adapter -> global step of its weights
        self.generate_calls = 0  # engine calls; exposed for tests and benchmarks
        self._last_call_s: float | None = None  # how long the last engine call took: sets the batcher's quiet gap
        self._pending: list[tuple[list[int], SamplingSpec, str | None, dict | None, asyncio.Future]] = []
        self._wakeup: asyncio.Event | None = None
        self._batcher: asyncio.Task | None = None
        # verl's abort/resume (asynchronous trainers, around a weight push): while paused, requests
        # wait (verl's "parked") and no engine call starts; with reject_request they end "aborted"
        self._paused = self._rejecting = False
        self._resumed: asyncio.Event | None = None  # clear while paused
        self._engine_idle: asyncio.Event | None = None  # clear while an engine call runs

    async def generate(
        self, request_id: str, prompt_ids: list[int], sampling_params: dict[str, Any], adapter: str | None = None,
        image_data: list | None = None, **_unused: Any,
    ) -> TokenOutput:
        """One request; ``adapter`` names a LoRA adapter loaded with ``load_adapter`` (None: the base);
        ``image_data`` the prompt's images (PIL), in the order of its image tokens."""
        prompt_ids = list(prompt_ids)
        images = self._image_inputs(prompt_ids, image_data) if image_data else None
        budget = min(self.response_length, self.prompt_length + self.response_length - len(prompt_ids))
        if budget < 1:
            raise ValueError(
                f"hf rollout: prompt of {len(prompt_ids)} tokens leaves no room within "
                f"rollout.prompt_length + rollout.response_length = {self.prompt_length + self.response_length}"
            )
        spec = SamplingSpec.from_verl(sampling_params, default_max_tokens=budget)
        served_by = self.policy if adapter is None else adapter
        if self._rejecting:
            return self._aborted(served_by)
        if self._batcher is None or self._batcher.done():  # first call, or its event loop has closed (asyncio.run per call)
            self._wakeup, self._resumed, self._engine_idle = asyncio.Event(), asyncio.Event(), asyncio.Event()
            self._engine_idle.set()
            if not self._paused:
                self._resumed.set()
            self._batcher = asyncio.get_running_loop().create_task(self._serve_batches())
        future = asyncio.get_running_loop().create_future()
        self._pending.append((prompt_ids, spec, adapter, images, future))
        self._wakeup.set()
        generation = await future
        if generation is None:  # rejected before its engine call began
            return self._aborted(served_by)
        # which weights answered: an adapter is a policy of its own (L1), with its own version
        version = self.global_steps if adapter is None else self.adapter_steps.get(adapter)
        return TokenOutput(
            token_ids=generation.token_ids,
            log_probs=generation.log_probs,
            stop_reason="completed",
            extra_fields={"global_steps": version, "policy": served_by},
        )

    async def _serve_batches(self) -> None:
        while True:
            await self._wakeup.wait()
            await self._resumed.wait()  # paused: the requests wait, no engine call starts (abort_all_requests)
            await self._gather()
            if self._paused:  # paused while gathering: resume_generation wakes the batcher again
                continue
            batch, self._pending = self._pending, []
            if not batch:
                continue
            prompts, specs, adapters, images, futures = zip(*batch)
            self.generate_calls += 1
            started = time.perf_counter()
            self._engine_idle.clear()
            try:
                outputs = await asyncio.to_thread(self.engine.generate, list(prompts), list(specs), list(adapters), list(images))
            except Exception as error:  # report to every waiting caller instead of dying silently
                for future in futures:
                    if not future.done():
                        future.set_exception(error)
                continue
            finally:
                self._last_call_s = time.perf_counter() - started
                self._engine_idle.set()
            for future, output in zip(futures, outputs):
                if not future.done():
                    future.set_result(output)

    def _image_inputs(self, prompt_ids: list[int], images: list) -> dict[str, torch.Tensor]:
        """The image processor's tensors of one request, checked against its prompt: each image must
        have as many image tokens there as the processor makes of it (a mismatch would fail the
        model's call, and with it every request batched beside this one)."""
        if self.image_processor is None:
            raise ValueError("hf rollout: a request with images, and this server's model is text-only (no vision_config)")
        inputs = dict(self.image_processor(images=list(images), return_tensors="pt"))
        merge = int(getattr(self.image_processor, "merge_size", 1)) ** 2
        expected = int(inputs["image_grid_thw"].prod(-1).sum()) // merge
        found = sum(token == self.engine.base_model.config.image_token_id for token in prompt_ids)
        if found != expected:
            raise ValueError(f"hf rollout: the prompt has {found} image tokens, and its {len(images)} image(s) make {expected}")
        return {"pixel_values": inputs["pixel_values"], "image_grid_thw": inputs["image_grid_thw"]}

    async def _gather(self) -> None:
        """Let more requests join the pending ones: return once a quiet gap (see BATCH_WAIT_FRACTION)
        has passed since the last one came, or BATCH_MAX_WAIT_S after this wait began. Each arrival
        wakes the wait, so the call starts one gap after the last request (waiting for a whole gap
        that held none cost up to two gaps of idle engine per call)."""
        loop = asyncio.get_running_loop()
        gap = quiet_gap(self._last_call_s)
        deadline = loop.time() + BATCH_MAX_WAIT_S
        while True:
            self._wakeup.clear()
            wait = min(gap, deadline - loop.time())
            if wait <= 0:
                return
            try:
                await asyncio.wait_for(self._wakeup.wait(), wait)
            except TimeoutError:  # quiet for a whole gap
                return

    async def update_weights(self, named_tensors: dict[str, torch.Tensor], global_steps: int | None = None) -> int:
        loaded = await asyncio.to_thread(self.engine.load_weights, named_tensors)
        if global_steps is not None:
            self.global_steps = global_steps
        return loaded

    async def load_adapter(
        self, name: str, named_tensors: dict[str, torch.Tensor], config: dict[str, Any], global_steps: int | None = None
    ) -> int:
        """Add or refresh LoRA adapter ``name`` (only its tensors travel; the base stays as it is)."""
        loaded = await asyncio.to_thread(self.engine.load_adapter, name, named_tensors, config)
        self.adapter_steps[name] = global_steps
        return loaded

    def get_stats(self) -> dict[str, Any]:
        return {
            "generate_calls": self.generate_calls, "device": self.device, "global_steps": self.global_steps,
            "policy": self.policy, "adapters": self.engine.adapters, "adapter_steps": dict(self.adapter_steps),
        }

    # Memory management. On CPU there is nothing to free, so these are explicit no-ops; on CUDA
    # (with rollout.free_cache_engine) sleep moves the model to host memory and wake_up brings it back.
    async def sleep(self, *_args, **_kwargs) -> None:
        if self.offload_when_asleep:
            await asyncio.to_thread(self.engine.move_to, "cpu")
            torch.cuda.empty_cache()

    async def wake_up(self, *_args, **_kwargs) -> None:
        if self.offload_when_asleep:
            await asyncio.to_thread(self.engine.move_to, self.device)

    async def clear_kv_cache(self) -> None:  # no persistent KV cache between requests
        return None

    async def release_kv_cache(self) -> None:
        return None

    async def resume_kv_cache(self) -> None:
        return None

    async def abort_all_requests(self, reject_request: bool = False) -> dict[str, Any]:
        """Pause generation (verl's asynchronous trainers, before a weight push). An engine call
        under way cannot be interrupted: it finishes first, and this returns after it, so no weights
        change under it. The requests waiting for the next call, and those that come until
        ``resume_generation``, wait for it (none has a token yet: each is answered whole by the
        weights pushed meanwhile, with no retry delay); with ``reject_request`` they end "aborted"
        with no tokens instead (verl's client asks again)."""
        self._paused, self._rejecting = True, reject_request
        if self._resumed is not None:
            self._resumed.clear()
        rejected = []
        if reject_request:
            rejected, self._pending = self._pending, []
            for *_request, future in rejected:
                if not future.done():
                    future.set_result(None)
        if self._engine_idle is not None:
            await self._engine_idle.wait()
        return {"aborted_count": len(rejected), "request_ids": []}

    async def resume_generation(self) -> None:
        self._paused = self._rejecting = False
        if self._resumed is not None:
            self._resumed.set()
            self._wakeup.set()  # requests that waited through the pause

    @staticmethod
    def _aborted(served_by: str) -> TokenOutput:
        # no version: no token came from any weights (verl's client takes its first version from the attempt that answers)
        return TokenOutput(token_ids=[], log_probs=[], stop_reason="aborted", extra_fields={"global_steps": None, "policy": served_by})

    async def start_profile(self, **_kwargs) -> None:
        return None

    async def stop_profile(self) -> None:
        return None

    async def set_global_steps(self, global_steps: int) -> None:
        self.global_steps = global_steps


class HFRolloutReplica(RolloutReplica):
    """One ``HFRolloutServer`` per replica, beside the trainer workers."""

    async def launch_servers(self) -> None:
        # The driver's platform decides (verl detects CUDA there even though Ray hides the devices).
        platform = get_platform()
        device = "cpu" if platform.device_name == "cpu" else "cuda"
        if device == "cuda" and not self.workers:
            raise NotImplementedError("hf rollout on CUDA shares the trainer workers' GPUs: use the hybrid engine")
        node_id = device_id = None
        if self.workers:
            resource = platform.ray_resource_name() if device == "cuda" else None
            node_id, device_id = await self.workers[0].__ray_call__.remote(
                lambda worker: (
                    ray.get_runtime_context().get_node_id(),
                    str(ray.get_runtime_context().get_accelerator_ids()[resource][0]) if resource else None,
                )
            )
        policy = rollout_policy(self.config)
        options = server_options(self.replica_rank, policy, self.max_concurrency, node_id, device_id, platform.ray_noset_envvars())
        server = ray.remote(HFRolloutServer).options(**options).remote(
            self.config, self.model_config, self.replica_rank, device
        )
        await server.get_stats.remote()  # surface model-loading errors here, in the driver
        self.servers = [server]
        self._server_handle = server
        self._server_address = options["name"]  # only a load-balancer key


class HFServerAdapter(BaseRollout):
    """Lives in each trainer worker; pushes weights to this rank's server (rollout rank 0 only)."""

    def __init__(self, config: Any, model_config: Any, device_mesh: Any, replica_rank: int = -1):
        super().__init__(config, model_config, device_mesh)
        rollout_world_size = (
            self.config.tensor_model_parallel_size
            * self.config.data_parallel_size
            * self.config.pipeline_model_parallel_size
        )
        rank = int(os.environ.get("RANK", 0))
        self.replica_rank = rank // rollout_world_size if replica_rank == -1 else replica_rank
        self.is_sender = rank % rollout_world_size == 0
        self._server = None

    @property
    def server(self):
        if self._server is None:  # the server starts after the trainer workers
            self._server = ray.get_actor(server_actor_name(self.replica_rank, rollout_policy(self.config)))
        return self._server

    async def resume(self, tags: list[str]) -> None:
        if self.is_sender:
            await self.server.wake_up.remote()

    async def release(self) -> None:
        if self.is_sender:
            await self.server.sleep.remote()

    async def update_weights(
        self, weights: Generator[tuple[str, torch.Tensor], None, None], wire_format: str = "named_tensors", **kwargs
    ) -> None:
        if wire_format != "named_tensors":
            raise ValueError(f"hf rollout: unsupported weight wire format {wire_format!r} (use checkpoint engine 'naive' or 'gloo')")
        peft_config, lora_name = kwargs.get("peft_config"), kwargs.get("lora_name")
        if peft_config is not None and lora_name is None:
            raise NotImplementedError(
                "hf rollout: verl's single unnamed LoRA adapter is synced merged; set actor_rollout_ref.model.lora.merge=True "
                "(or give each role an adapter: pettingllms.policies.<name>.adapter)"
            )
        # Every rank must drain the generator (it performs collective gathers); only the sender keeps
        # a host copy, already in the rollout's dtype (the trainer's full tensors are fp32 masters).
        named = {}
        async for name, tensor in ensure_async_iterator(weights):  # a generator (naive), or a checkpoint engine's receiver
            if self.is_sender:
                dtype = _torch_dtype(str(self.config.dtype), tensor.device.type) if tensor.is_floating_point() else tensor.dtype  # bytes stay bytes
                named[name] = tensor.detach().to(dtype).to("cpu", copy=True)
        if not self.is_sender:
            return
        if lora_name is not None:  # one adapter's tensors only (L1)
            await self.server.load_adapter.remote(lora_name, named, dict(peft_config), kwargs.get("global_steps"))
            return
        base, adapters = split_pushed(named)  # through a checkpoint engine: the adapters named in the stream (mas_separate_async)
        if base or not adapters:
            await self.server.update_weights.remote(base, kwargs.get("global_steps"))
        for name, (config, tensors) in adapters.items():
            await self.server.load_adapter.remote(name, tensors, config, kwargs.get("global_steps"))
