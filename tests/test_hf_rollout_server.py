"""The hf rollout as verl uses it: a Ray server actor that batches concurrent requests, and the
trainer-side adapter that pushes updated weights to it."""

import asyncio

import pytest
import ray
import torch
from omegaconf import OmegaConf

from verl.workers.config import RolloutConfig

from pettingllms_verl.backends.cpu.hf_rollout import HFRolloutServer, HFServerAdapter, server_actor_name


@pytest.fixture(scope="module")
def ray_session():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def rollout_config():
    return RolloutConfig(name="hf", tensor_model_parallel_size=1, prompt_length=64, response_length=8, dtype="float32")


@pytest.fixture(scope="module")
def server(ray_session, rollout_config, tiny_model_dir):
    handle = (
        ray.remote(HFRolloutServer)
        .options(name=server_actor_name(0), max_concurrency=64, num_cpus=0)
        .remote(rollout_config, OmegaConf.create({"path": tiny_model_dir}), 0)
    )
    ray.get(handle.get_stats.remote())
    return handle


def test_concurrent_requests_are_batched(server, chat_ids):
    prompts = [chat_ids(f"request {i}") for i in range(8)]
    calls_before = ray.get(server.get_stats.remote())["generate_calls"]
    outs = ray.get([server.generate.remote(f"r{i}", p, {"temperature": 0.0}) for i, p in enumerate(prompts)])
    calls = ray.get(server.get_stats.remote())["generate_calls"] - calls_before
    assert calls <= 2, f"8 concurrent requests took {calls} engine calls"
    for out in outs:
        assert 0 < len(out.token_ids) <= 8 and len(out.log_probs) == len(out.token_ids)
        assert out.stop_reason == "completed"


def test_prompt_longer_than_the_budget_is_refused(server):
    with pytest.raises(ray.exceptions.RayTaskError, match="leaves no room"):
        ray.get(server.generate.remote("long", [5] * 72, {"temperature": 0.0}))


def test_adapter_update_makes_replica_sample_from_the_updated_actor(server, rollout_config, chat_ids, updated_actor):
    prompt = chat_ids("after the update")
    actor = updated_actor(prompt)

    def greedy_reply_log_probs():
        out = ray.get(server.generate.remote("g", prompt, {"temperature": 0.0, "max_tokens": 6}))
        return out.token_ids, torch.tensor(out.log_probs)

    def actor_log_probs(tokens):
        with torch.no_grad():
            logits = actor(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1]
        return torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens)[:, None])[:, 0]

    tokens, stale = greedy_reply_log_probs()
    assert (stale - actor_log_probs(tokens)).abs().max() > 1e-3  # before the sync the replica is stale

    adapter = HFServerAdapter(rollout_config, model_config=None, device_mesh=None)
    asyncio.run(adapter.update_weights(iter(actor.state_dict().items()), global_steps=7))

    tokens, fresh = greedy_reply_log_probs()
    torch.testing.assert_close(fresh, actor_log_probs(tokens), atol=1e-4, rtol=0)
    assert ray.get(server.get_stats.remote())["global_steps"] == 7
