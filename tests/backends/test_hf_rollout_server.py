"""The hf rollout as verl uses it: a Ray server actor that batches concurrent requests, and the
trainer-side adapter that pushes updated weights to it."""

import asyncio
import contextlib
import os
import threading

import pytest
import ray
import torch
from omegaconf import OmegaConf

from verl.workers.config import RolloutConfig

from pettingllms_verl.backends.hf import attention
from pettingllms_verl.backends.hf import rollout as hf_rollout
from pettingllms_verl.backends.hf.rollout import (
    HFRolloutServer,
    HFServerAdapter,
    claim_device,
    quiet_gap,
    server_actor_name,
    server_options,
)

NOSET = "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"  # what verl's CUDA platform lists in ray_noset_envvars()


@pytest.fixture(scope="module")
def ray_session():
    # A "GPU" resource as on a GPU node (and as the CPU recipes declare for trainer ranks).
    ray.init(num_cpus=2, num_gpus=1, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def rollout_config():
    return RolloutConfig(name="hf", tensor_model_parallel_size=1, prompt_length=64, response_length=8, dtype="float32")


@pytest.fixture(scope="module")
def server(ray_session, rollout_config, tiny_model_dir):
    handle = (
        ray.remote(HFRolloutServer)
        .options(name=server_actor_name(0, "shared"), max_concurrency=64, num_cpus=0)
        .remote(rollout_config, OmegaConf.create({"path": tiny_model_dir}), 0)
    )
    ray.get(handle.get_stats.remote())
    return handle


@contextlib.contextmanager
def patient_batcher(server, gap_s: float = 2.0):
    """The server's batcher waits ``gap_s`` of quiet (not a share of its last call, a few ms once
    calls are timed): requests sent together join one call however slowly a loaded machine sends them."""
    names = ("BATCH_WINDOW_S", "BATCH_MAX_GAP_S", "BATCH_MAX_WAIT_S")

    def setting(values):
        return server.__ray_call__.remote(lambda _, values: [setattr(hf_rollout, name, value) for name, value in values.items()], values)

    before = ray.get(server.__ray_call__.remote(lambda _: {name: getattr(hf_rollout, name) for name in names}))
    ray.get(setting({"BATCH_WINDOW_S": gap_s, "BATCH_MAX_GAP_S": gap_s, "BATCH_MAX_WAIT_S": 30 * gap_s}))
    try:
        yield
    finally:
        ray.get(setting(before))


def test_concurrent_requests_are_batched(server, chat_ids):
    prompts = [chat_ids(f"request {i}") for i in range(8)]
    calls_before = ray.get(server.get_stats.remote())["generate_calls"]
    with patient_batcher(server):
        outs = ray.get([server.generate.remote(f"r{i}", p, {"temperature": 0.0}) for i, p in enumerate(prompts)])
    calls = ray.get(server.get_stats.remote())["generate_calls"] - calls_before
    assert calls == 1, f"8 concurrent requests took {calls} engine calls"
    for out in outs:
        assert 0 < len(out.token_ids) <= 8 and len(out.log_probs) == len(out.token_ids)
        assert out.stop_reason == "completed"


def test_requests_that_trickle_in_share_one_engine_call(rollout_config, tiny_model_dir, chat_ids, monkeypatch):
    """Episodes start (and plan requests follow their sandboxed tool runs) one after another: each
    request arriving within the quiet gap joins the pending batch instead of starting a cohort of
    its own. The gap (1 s here) is 100x the spacing of the requests."""
    monkeypatch.setattr(hf_rollout, "BATCH_MAX_GAP_S", 1.0)
    monkeypatch.setattr(hf_rollout, "BATCH_MAX_WAIT_S", 30.0)
    server = HFRolloutServer(rollout_config, OmegaConf.create({"path": tiny_model_dir}), 0)

    async def trickle():
        requests = []
        for i in range(6):
            requests.append(asyncio.ensure_future(server.generate(f"r{i}", chat_ids(f"episode {i}"), {"temperature": 0.0})))
            await asyncio.sleep(0.01)
        return await asyncio.gather(*requests)

    outs = asyncio.run(trickle())
    assert server.generate_calls == 1
    assert server.engine.model.config._attn_implementation == attention.NAME  # on CPU: K/V heads not repeated
    assert all(0 < len(out.token_ids) <= 8 for out in outs)


def test_the_quiet_gap_is_a_share_of_the_last_call_within_bounds():
    assert quiet_gap(None) == hf_rollout.BATCH_MAX_GAP_S  # nothing timed yet: wait the most
    assert quiet_gap(0.01) == hf_rollout.BATCH_WINDOW_S  # a fast engine (the tiny model) waits the least
    assert quiet_gap(2.0) == pytest.approx(hf_rollout.BATCH_WAIT_FRACTION * 2.0)
    assert quiet_gap(600.0) == hf_rollout.BATCH_MAX_GAP_S


class _VirtualClockLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock moves only when it would sleep: a wait of t seconds ends at exactly
    t, whatever the machine's load (for the batcher's timing, with nothing run in threads)."""

    def __init__(self):
        super().__init__()
        self.now = 0.0
        select = self._selector.select

        def advance(timeout=None):
            events = select(0)
            if not events and timeout:
                self.now += timeout
            return events

        self._selector.select = advance

    def time(self) -> float:
        return self.now


def _gather_time(last_call_s: float | None, arrivals: list[float]) -> tuple[float, int]:
    """When ``_gather`` returns (virtual seconds) for one request pending at 0 and one more at each
    of ``arrivals``, and how many requests were pending by then."""
    server = object.__new__(HFRolloutServer)
    server._last_call_s, server._pending = last_call_s, ["r0"]
    loop = _VirtualClockLoop()

    async def scenario():
        server._wakeup = asyncio.Event()
        for i, at in enumerate(arrivals, start=1):
            loop.call_at(at, lambda i=i: (server._pending.append(f"r{i}"), server._wakeup.set()))
        await server._gather()
        return loop.time(), len(server._pending)

    try:
        return loop.run_until_complete(scenario())
    finally:
        loop.close()


def test_the_batcher_starts_one_quiet_gap_after_the_last_request(monkeypatch):
    """A request that arrives within the gap restarts it: the call starts one gap after the last
    request (not at the end of a whole gap that held none), and the first waits BATCH_MAX_WAIT_S at most."""
    monkeypatch.setattr(hf_rollout, "BATCH_MAX_WAIT_S", 1.0)
    gap = quiet_gap(2.0)  # 0.1 s
    assert _gather_time(2.0, []) == (pytest.approx(gap), 1)
    assert _gather_time(2.0, [0.05, 0.12]) == (pytest.approx(0.12 + gap), 3)
    assert _gather_time(2.0, [2 * gap]) == (pytest.approx(gap), 1)  # came after a quiet gap: the next call's
    trickle = [0.03 + 0.05 * i for i in range(1, 40)]  # one every half gap, for longer than the most a request waits
    assert _gather_time(2.0, trickle) == (pytest.approx(1.0), 20)


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


@ray.remote
class EnvProbe:
    def cuda_visible_devices(self):
        return os.environ.get("CUDA_VISIBLE_DEVICES")


def test_cuda_server_is_pinned_to_the_trainer_workers_device(ray_session):
    """The server asks Ray for no GPU; Ray (older releases, or RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=1)
    then hides every device from it. The options must keep the trainer worker's device visible."""
    node_id = ray.get_runtime_context().get_node_id()
    options = server_options(3, "shared", 8, node_id, "5", [NOSET])
    assert options["num_gpus"] == 0 and options["scheduling_strategy"].node_id == node_id
    assert options["scheduling_strategy"].soft is False
    del options["name"]
    options["runtime_env"]["env_vars"]["RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO"] = "1"
    assert ray.get(EnvProbe.options(**options).remote().cuda_visible_devices.remote()) == "5"
    # Negative control: without the NOSET variable Ray empties the list.
    del options["runtime_env"]["env_vars"][NOSET]
    assert ray.get(EnvProbe.options(**options).remote().cuda_visible_devices.remote()) == ""


def test_cpu_server_is_placed_on_its_workers_node_and_asks_for_nothing():
    node = "ab" * 28  # a node id's form
    options = server_options(0, "shared", 8, node, None, [])
    assert options.pop("scheduling_strategy").node_id == node and "runtime_env" not in options
    assert options == {"name": server_actor_name(0, "shared"), "max_concurrency": 8, "num_cpus": 0, "num_gpus": 0}
    assert "scheduling_strategy" not in server_options(0, "shared", 8, None, None, [])  # no workers (a standalone replica)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only case")
def test_cuda_server_without_a_visible_device_fails_loudly(rollout_config):
    with pytest.raises(RuntimeError, match="sees no CUDA device.*refusing to fall back to CPU"):
        claim_device("cuda", rollout_config)


def test_a_cpu_server_takes_the_threads_asked_for_but_never_more_than_its_cores(monkeypatch):
    """A recipe written for 2 cores (``base/cpu_one_run``) on a machine that lets the process use
    one: two OpenMP threads on one core is the oversubscription that made decoding ~30x slower."""
    before = torch.get_num_threads()
    try:
        monkeypatch.setattr(hf_rollout, "usable_cores", lambda: 3)
        for asked, taken in ((2, 2), (8, 3), (1, 1)):
            claim_device("cpu", OmegaConf.create({"engine_kwargs": {"hf": {"torch_threads": asked}}}))
            assert torch.get_num_threads() == taken
        claim_device("cpu", OmegaConf.create({"engine_kwargs": None}))
        assert torch.get_num_threads() == 1  # the default: one thread
    finally:
        torch.set_num_threads(before)


def test_a_server_answers_calls_from_one_event_loop_after_another(rollout_config, tiny_model_dir, chat_ids):
    """A script or test drives the server with one asyncio.run per call. The request batcher belongs
    to the loop that started it: a later loop must get its own, not wait on a closed loop's (the
    first GPU run hung here)."""
    server = HFRolloutServer(rollout_config, OmegaConf.create({"path": tiny_model_dir}), 0)
    prompt = chat_ids("one loop, then another")

    def greedy():
        request = server.generate("g", prompt, {"temperature": 0.0, "max_tokens": 6})
        return asyncio.run(asyncio.wait_for(request, timeout=120)).token_ids

    first = greedy()
    assert greedy() == first and server.generate_calls == 2


def test_a_cpu_server_folds_adapters_unless_told_not_to(rollout_config, tiny_model_dir):
    """``engine_kwargs.hf.merge_adapters``: on by default on CPU (a copy of the adapted weights per
    adapter buys decode steps without adapter matmuls), off when the config says so."""
    model = OmegaConf.create({"path": tiny_model_dir})
    assert HFRolloutServer(rollout_config, model, 0).engine.merge_adapters
    off = RolloutConfig(name="hf", tensor_model_parallel_size=1, prompt_length=64, response_length=8, dtype="float32",
                        engine_kwargs={"hf": {"merge_adapters": False}})
    assert not HFRolloutServer(off, model, 0).engine.merge_adapters


@pytest.mark.gpu
def test_cuda_server_sleep_frees_the_device_and_wake_up_restores_it(rollout_config, tiny_model_dir, chat_ids):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    server = HFRolloutServer(rollout_config, OmegaConf.create({"path": tiny_model_dir}), 0, device="cuda")
    prompt = chat_ids("on the gpu")

    async def greedy():
        return (await server.generate("g", prompt, {"temperature": 0.0, "max_tokens": 6})).token_ids

    awake_tokens = asyncio.run(greedy())
    awake_bytes = torch.cuda.memory_allocated()
    asyncio.run(server.sleep())
    assert torch.cuda.memory_allocated() < awake_bytes - 0.9 * sum(
        p.numel() * p.element_size() for p in server.engine.model.parameters()
    )
    asyncio.run(server.wake_up())
    assert server.engine.device.type == "cuda"
    assert asyncio.run(greedy()) == awake_tokens


@pytest.mark.gpu
def test_cuda_server_stays_on_the_device_when_verl_will_not_wake_it(tiny_model_dir):
    # verl sleeps the replica every step but calls wake_up only with rollout.free_cache_engine.
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    config = RolloutConfig(name="hf", tensor_model_parallel_size=1, prompt_length=64, response_length=8,
                           dtype="bfloat16", free_cache_engine=False)
    server = HFRolloutServer(config, OmegaConf.create({"path": tiny_model_dir}), 0, device="cuda")
    asyncio.run(server.sleep())
    assert server.engine.device.type == "cuda" and server.engine.model.dtype == torch.bfloat16
    assert server.engine.model.config._attn_implementation == "sdpa"


def test_requests_with_different_adapters_share_one_engine_call(server, chat_ids):
    """Runs last: it leaves two LoRA adapters on the module's server."""
    from support.reference import LORA, reference_log_probs
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
    from transformers import AutoModelForCausalLM

    # the reference starts from the server's base as it is now (an earlier test updated it)
    model_path, base = ray.get(server.__ray_call__.remote(lambda s: (s.engine.model.name_or_path, s.engine._base_state())))
    torch.manual_seed(5)
    reference = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    reference.load_state_dict(base)
    reference = get_peft_model(reference, LoraConfig(**LORA), adapter_name="planner")
    reference.add_adapter("coder", LoraConfig(**LORA))
    reference.eval()
    for name in ("planner", "coder"):
        ray.get(server.load_adapter.remote(name, get_peft_model_state_dict(reference, adapter_name=name), LORA))
    assert ray.get(server.get_stats.remote())["adapters"] == ["coder", "planner"]

    prompt = chat_ids("route me")
    calls_before = ray.get(server.get_stats.remote())["generate_calls"]
    adapters = ["planner", "coder", None, "coder"]
    with patient_batcher(server):
        outs = ray.get([server.generate.remote(f"a{i}", prompt, {"temperature": 0.0, "max_tokens": 6}, adapter=a)
                        for i, a in enumerate(adapters)])
    assert ray.get(server.get_stats.remote())["generate_calls"] - calls_before == 1
    assert outs[1].token_ids == outs[3].token_ids
    for out, adapter in zip(outs[:2], adapters[:2]):  # each row's log-probs are its own adapter's
        reference.set_adapter(adapter)
        expected = reference_log_probs(reference, prompt, out.token_ids)
        torch.testing.assert_close(torch.tensor(out.log_probs), expected, atol=1e-4, rtol=0)


def test_abort_pauses_generation_until_resume_and_never_swaps_weights_under_a_running_call(rollout_config, tiny_model_dir, chat_ids):
    """verl's asynchronous trainers pause every replica before a weight push. The engine call under
    way finishes first, and abort returns only after it (no weights change under it); a request
    waiting for the next call, and one that comes while paused, waits for resume_generation and is
    answered whole by the weights pushed meanwhile; with reject_request they end "aborted", no tokens."""
    server = HFRolloutServer(rollout_config, OmegaConf.create({"path": tiny_model_dir}), 0)
    engine_generate, started, release = server.engine.generate, threading.Event(), threading.Event()

    def held_call(*args):
        started.set()
        release.wait(timeout=120)
        return engine_generate(*args)

    server.engine.generate = held_call
    prompt = chat_ids("pause me")

    def ask(name):
        return asyncio.ensure_future(server.generate(name, prompt, {"temperature": 0.0, "max_tokens": 4}))

    async def scenario():
        await server.set_global_steps(5)
        running = ask("a")
        await asyncio.to_thread(started.wait, 120)
        waiting = ask("b")
        await asyncio.sleep(0)  # "b" joins the pending batch behind the running call
        abort = asyncio.ensure_future(server.abort_all_requests())
        during_pause = ask("c")
        await asyncio.sleep(0.1)
        assert not abort.done()  # the engine call under way holds it: nothing can set the idle event before release
        release.set()
        answered, abort_result = await running, await abort
        await asyncio.sleep(0.1)
        assert not waiting.done() and not during_pause.done()  # no engine call starts while paused
        await server.set_global_steps(6)  # the push
        await server.resume_generation()
        parked = await waiting, await during_pause
        await server.abort_all_requests(reject_request=True)
        rejected = await server.generate("d", prompt, {"temperature": 0.0, "max_tokens": 4})
        await server.resume_generation()
        return answered, abort_result, parked, rejected

    answered, abort_result, parked, rejected = asyncio.run(scenario())
    assert answered.stop_reason == "completed" and answered.token_ids and answered.extra_fields["global_steps"] == 5
    assert abort_result["aborted_count"] == 0
    for out in parked:  # greedy, the same weights (the push only renumbered them): the same reply, at version 6
        assert out.stop_reason == "completed" and out.token_ids == answered.token_ids and out.extra_fields["global_steps"] == 6
    assert rejected.stop_reason == "aborted" and rejected.token_ids == [] and rejected.extra_fields["global_steps"] is None
