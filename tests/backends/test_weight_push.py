"""The ``gloo`` checkpoint engine (backends/cpu/weight_push.py): a trainer's weights reach every
rollout worker whole, in buckets, over a process group of their own, as verl's
CheckpointEngineManager drives it (prepare, build_topology, init_process_group, send/receive, finalize)."""

from __future__ import annotations

import asyncio
import io
import multiprocessing

import torch
from verl.checkpoint_engine import CheckpointEngineRegistry

from pettingllms_verl.backends.cpu import weight_push
from pettingllms_verl.backends.cpu.weight_push import BACKEND, NOT_IN_GROUP, GlooCheckpointEngine


def _weights() -> list[tuple[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    return [
        ("embed.weight", torch.randn(64, 32, generator=generator)),  # 8 KB: a bucket of its own at the test's bucket size
        ("layer.0.bias", torch.randn(7, generator=generator)),  # odd sizes: offsets in a bucket not aligned to 4 bytes
        ("layer.0.half", torch.randn(3, 5, generator=generator).to(torch.bfloat16)),
        ("steps", torch.tensor([3, 1, 4], dtype=torch.int64)),
        ("mask", torch.tensor([True, False, True])),
    ]


async def _generator():
    for item in _weights():
        yield item


def _play(role: str, topology: dict, queue) -> None:
    engine = GlooCheckpointEngine(bucket_size=4096, is_master=role == "sender", timeout_s=60)
    engine.init_process_group(**topology)
    if role == "sender":
        asyncio.run(engine.send_weights(_generator(), global_steps=3))
        queue.put((role, None))
    elif role == "bystander":  # the trainer's rank 1: drains its generator, sends nothing
        asyncio.run(engine.send_weights(_generator(), global_steps=3))
        queue.put((role, engine.group is None))
    else:

        async def receive():
            return [(name, tensor.clone()) async for name, tensor in engine.receive_weights(global_steps=3)]

        buffer = io.BytesIO()  # bytes, not tensors: a queue hands tensors over as shared memory, gone once this process exits
        torch.save(asyncio.run(receive()), buffer)
        queue.put((role, buffer.getvalue()))
    engine.finalize()


def test_a_push_reaches_every_rollout_worker_whole_in_buckets():
    assert CheckpointEngineRegistry.get(BACKEND) is GlooCheckpointEngine
    sender = GlooCheckpointEngine(bucket_size=4096, is_master=True)
    metadata = [sender.prepare(), GlooCheckpointEngine(bucket_size=4096).prepare(), {}, {}]
    assert set(metadata[0]) == {"host", "port"} and metadata[1] == {}
    actor, rollout = GlooCheckpointEngine.build_topology(2, 2, metadata)  # two trainer ranks, two rollout workers
    assert actor["rank"] == [0, NOT_IN_GROUP] and rollout["rank"] == [1, 2]
    assert actor["world_size"] == rollout["world_size"] == [3, 3]
    metadata[0]["host"] = "127.0.0.1"
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    roles = [("sender", {k: v[0] for k, v in actor.items()}), ("bystander", {k: v[1] for k, v in actor.items()}),
             ("receiver", {k: v[0] for k, v in rollout.items()}), ("receiver", {k: v[1] for k, v in rollout.items()})]
    processes = [context.Process(target=_play, args=(role, topology, queue)) for role, topology in roles]
    for process in processes:
        process.start()
    results = [queue.get(timeout=120) for _ in processes]
    for process in processes:
        process.join(timeout=60)
        assert process.exitcode == 0
    expected = _weights()
    received = [torch.load(io.BytesIO(value)) for role, value in results if role == "receiver"]
    assert len(received) == 2
    for weights in received:
        assert [name for name, _ in weights] == [name for name, _ in expected]
        for (_, got), (_, want) in zip(weights, expected):
            assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)
    assert [value for role, value in results if role == "bystander"] == [True]


def test_the_sender_cuts_buckets_at_the_configured_size():
    engine = GlooCheckpointEngine(bucket_size=4096, is_master=True)
    engine.rank = weight_push.SENDER
    sent = []
    engine._send_bucket = lambda bucket, last: sent.append(([name for name, _ in bucket], last))
    asyncio.run(engine.send_weights(_generator()))
    assert sent == [(["embed.weight"], False), (["layer.0.bias", "layer.0.half", "steps", "mask"], True)]
