"""verl checkpoint engine ``gloo``: pushes a policy's weights from its trainer to a rollout pool of
its own over torch's gloo collectives, so verl's ``separate_async`` schedule runs where there is no
nccl, nixl or mooncake (a CPU machine, a CPU cluster).

Registered through verl's ``CheckpointEngineRegistry`` (its public extension point); selected with
``actor_rollout_ref.rollout.checkpoint_engine.backend=gloo``. Each push, verl's
``CheckpointEngineManager`` asks every process for ``prepare``, builds the topology, calls
``init_process_group`` on all of them at once, then ``send_weights`` on the trainer's ranks beside
``receive_weights`` on the rollout's, and ``finalize``. Here the trainer's rank 0 broadcasts to the
rollout workers, in buckets of ``update_weights_bucket_megabytes``: each bucket a header (the
tensors' names, shapes, dtypes; pickled) then one flat byte tensor. The trainer's other ranks take
no part but drain their generator (it gathers each full tensor over them).
"""

from __future__ import annotations

import pickle
import socket
from datetime import timedelta
from typing import Any

import ray
import torch
import torch.distributed as dist
from verl.checkpoint_engine import CheckpointEngine, CheckpointEngineRegistry
from verl.workers.rollout.utils import ensure_async_iterator

BACKEND = "gloo"
SENDER = 0  # the trainer's rank 0, in the push's process group
NOT_IN_GROUP = -1  # the trainer's other ranks


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]


@CheckpointEngineRegistry.register(BACKEND)
class GlooCheckpointEngine(CheckpointEngine):
    """One push from a trainer's rank 0 to its rollout workers (see the module's docstring)."""

    def __init__(self, bucket_size: int, is_master: bool = False, timeout_s: float = 600.0) -> None:
        self.bucket_size = bucket_size
        self.is_master = is_master  # the trainer's rank 0 (verl passes it to the trainer's engines only)
        self.timeout = timedelta(seconds=timeout_s)
        self.rank = NOT_IN_GROUP
        self.group: dist.ProcessGroup | None = None
        self.store: dist.TCPStore | None = None

    def prepare(self) -> dict[str, Any]:
        """Where the push's rendezvous listens (the sender's address); the others add nothing."""
        if not self.is_master:
            return {}
        return {"host": ray.util.get_node_ip_address(), "port": _free_port()}

    @classmethod
    def build_topology(cls, actor_wg_world_size: int, rollout_world_size: int, metadata: list[dict]):
        """The trainer's rank 0 is rank 0 of a group of ``rollout_world_size + 1``; its other ranks sit out."""
        master = metadata[0]  # verl lists the trainer's ranks first
        if not master:
            raise ValueError("gloo checkpoint engine: the trainer's rank 0 gave no rendezvous address")
        size = rollout_world_size + 1
        actor = {"rank": [SENDER] + [NOT_IN_GROUP] * (actor_wg_world_size - 1), "world_size": [size] * actor_wg_world_size,
                 "master": [master] * actor_wg_world_size}
        rollout = {"rank": list(range(1, size)), "world_size": [size] * rollout_world_size, "master": [master] * rollout_world_size}
        return actor, rollout

    def init_process_group(self, rank: int, world_size: int, master: dict) -> None:
        self.rank = rank
        if rank == NOT_IN_GROUP:
            return
        self.store = dist.TCPStore(master["host"], master["port"], world_size, is_master=rank == SENDER, timeout=self.timeout)
        self.group = dist.ProcessGroupGloo(self.store, rank, world_size, self.timeout)

    def finalize(self) -> None:
        self.group = self.store = None
        self.rank = NOT_IN_GROUP

    def _broadcast(self, tensor: torch.Tensor) -> torch.Tensor:
        options = dist.BroadcastOptions()
        options.rootRank = SENDER
        self.group.broadcast([tensor], options).wait()
        return tensor

    def _broadcast_header(self, header: Any = None) -> Any:
        """A picklable object from the sender to every rank (its length first)."""
        payload = torch.frombuffer(bytearray(pickle.dumps(header)), dtype=torch.uint8) if self.rank == SENDER else None
        length = self._broadcast(torch.tensor([len(payload) if payload is not None else 0], dtype=torch.int64))
        if payload is None:
            payload = torch.empty(int(length.item()), dtype=torch.uint8)
        return pickle.loads(self._broadcast(payload).numpy().tobytes())

    async def send_weights(self, weights, global_steps: int | None = None) -> dict:
        if self.rank != SENDER:
            async for _ in ensure_async_iterator(weights):  # every rank takes part in gathering each full tensor
                pass
            return {}
        bucket: list[tuple[str, torch.Tensor]] = []
        size = 0
        async for name, tensor in ensure_async_iterator(weights):
            tensor = tensor.detach().to("cpu").contiguous()
            if bucket and size + tensor.nbytes > self.bucket_size:
                self._send_bucket(bucket, last=False)
                bucket, size = [], 0
            bucket.append((name, tensor))
            size += tensor.nbytes
        self._send_bucket(bucket, last=True)
        return {}

    def _send_bucket(self, bucket: list[tuple[str, torch.Tensor]], last: bool) -> None:
        header = {"tensors": [(name, tuple(t.shape), t.dtype) for name, t in bucket], "last": last}
        self._broadcast_header(header)
        flat = torch.cat([t.reshape(-1).view(torch.uint8) for _, t in bucket]) if bucket else torch.empty(0, dtype=torch.uint8)
        self._broadcast(flat)

    async def receive_weights(self, global_steps: int | None = None):
        while True:
            header = self._broadcast_header()
            sizes = [torch.Size(shape).numel() * dtype.itemsize for _, shape, dtype in header["tensors"]]
            flat = self._broadcast(torch.empty(sum(sizes), dtype=torch.uint8))
            offset = 0
            for (name, shape, dtype), nbytes in zip(header["tensors"], sizes):
                yield name, flat[offset:offset + nbytes].clone().view(dtype).reshape(shape)  # a copy: aligned for its dtype
                offset += nbytes
            if header["last"]:
                return
