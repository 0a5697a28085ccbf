"""Each reply is trained at the temperature it was sampled at: a batch's per-row ``mas_temperature``
field replaces verl's one scalar in the engine's log-probs (old log-probs, reference, update)."""

import pytest
import torch

from pettingllms_verl.config import ROW_TEMPERATURE, PettingLLMsConfig, load
from support.local_engine import local_engine, no_padding_batch
from pettingllms_verl.trainer.shared_prefix import SharedPrefixFSDPEngine


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    return local_engine(tiny_model_dir, engine_cls=SharedPrefixFSDPEngine)


def _log_probs(engine, prompts, replies, share: bool, temperatures=None, temperature=1.0):
    data = no_padding_batch(prompts, replies, temperature=temperature, micro_batch_size_per_gpu=len(prompts))
    if temperatures is not None:
        data[ROW_TEMPERATURE] = torch.tensor(temperatures, dtype=torch.float32)
    engine.share_prefix = share
    output = engine.forward_backward_batch(data, loss_function=None, forward_only=True)
    # each reply token's log-prob, as verl's losses read them: from the position before it
    return [t[-len(reply) - 1:-1] for t, reply in zip(output["model_output"]["log_probs"].unbind(), replies)]


@pytest.mark.parametrize("share", [False, True], ids=["plain", "shared-prefix"])
def test_each_row_is_scored_at_its_own_temperature(engine, share):
    prompts = [[5, 6, 7, 8], [5, 6, 7, 8], [9, 10, 11]]  # two branches of one prompt, one other prompt
    replies = [[12, 13, 14], [15, 16], [17, 18, 19]]
    temperatures = [1.0, 2.0, 0.5]
    mixed = _log_probs(engine, prompts, replies, share, temperatures)
    for row, temperature in enumerate(temperatures):
        (alone,) = _log_probs(engine, [prompts[row]], [replies[row]], share, temperature=temperature)
        torch.testing.assert_close(mixed[row], alone, atol=1e-5, rtol=0)
    # and the rows really differ from the scalar's scoring (the test would pass on a no-op otherwise)
    scalar = _log_probs(engine, prompts, replies, share)
    assert not torch.allclose(mixed[1], scalar[1], atol=1e-3)


def test_one_temperature_for_every_row_reaches_verl_as_its_scalar():
    """verl skips rescaling the logits only for a scalar 1 (and its fused kernels take no tensor)."""
    from support.local_engine import no_padding_batch as batch
    from pettingllms_verl.trainer.shared_prefix import _with_row_temperatures

    data = batch([[5, 6], [7]], [[8], [9, 10]], temperature=0.7)
    data[ROW_TEMPERATURE] = torch.tensor([1.0, 1.0])
    assert _with_row_temperatures(data)["temperature"] == 1.0
    data[ROW_TEMPERATURE] = torch.tensor([1.0, 2.0])
    assert _with_row_temperatures(data)["temperature"].tolist() == [1.0, 2.0]
    assert data["temperature"] == 0.7  # the caller's batch is left as it was


def test_a_role_samples_at_its_own_then_its_policys_then_the_rollouts_temperature():
    settings = load({
        "policies": {"planner": {"overrides": {"rollout": {"temperature": 0.7}}}, "tool": {}},
        "roles": {"plan": {"policy": "planner"}, "tool": {"policy": "tool"}, "other": {"policy": "planner", "sampling": {"temperature": 1.3}}},
    })
    assert settings.sampling_overrides("plan", validate=False)["temperature"] == 0.7
    assert settings.sampling_overrides("other", validate=False)["temperature"] == 1.3
    assert "temperature" not in settings.sampling_overrides("tool", validate=False)
    assert "temperature" not in settings.sampling_overrides("plan", validate=True)  # validation: verl's val_kwargs
    assert "temperature" not in PettingLLMsConfig().sampling_overrides("plan", validate=False)
