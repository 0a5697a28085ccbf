"""Each LoRA adapter's optimizer group holds exactly the tensors peft holds for it (embedding LoRA
and DoRA included), and the start-up check names any tensor that would train outside its group.
The engine's adapter and optimizer methods run on the peft model alone: no process group, no FSDP."""

from __future__ import annotations

import pytest
import torch

from pettingllms_verl.registration import register

register()  # the CPU platform before verl resolves its device
from pettingllms_verl.trainer.multi_lora import MultiLoRAFSDPEngine  # noqa: E402

ADAPTERS = ("coder", "tester")


def _engine(model_dir: str, targets: list[str], **lora):
    """(engine, peft model): two adapters ``ADAPTERS`` on ``targets``, ``coder`` active, as
    ``_build_lora_module`` leaves them before FSDP wraps the model."""
    from transformers import AutoModelForCausalLM
    from verl.workers.config import FSDPOptimizerConfig

    from pettingllms_verl.config import ADAPTERS_KEY, AdapterConfig

    spec = {**AdapterConfig(rank=4, alpha=8, target_modules=targets).lora_config(), **lora, "path": None, "trainable": True}
    engine = MultiLoRAFSDPEngine.__new__(MultiLoRAFSDPEngine)
    engine.model_config = {"lora": {ADAPTERS_KEY: {name: dict(spec) for name in ADAPTERS}}}
    engine.optimizer_config = FSDPOptimizerConfig(lr=1e-2, weight_decay=0.0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return engine, engine._build_lora_module(model)


@pytest.mark.parametrize("lora", [{}, {"use_dora": True}], ids=["lora", "dora"])
def test_embedding_lora_tensors_are_in_their_adapters_group_and_train(tiny_model_dir, lora):
    engine, model = _engine(tiny_model_dir, ["embed_tokens", "q_proj"], **lora)
    optimizer = engine._build_optimizer(model)
    groups = {group["adapter"]: {id(p) for p in group["params"]} for group in optimizer.param_groups}
    named = dict(model.named_parameters())
    # peft: ...embed_tokens.lora_embedding_A.<name> (no trailing dot), DoRA's ...lora_magnitude_vector.<name>.weight
    embedding = {name: [n for n in named if ".embed_tokens.lora_" in n and f".{name}" in n] for name in ADAPTERS}
    assert all(len(names) == (3 if lora else 2) for names in embedding.values()), embedding
    for name, names in embedding.items():
        assert [n for n in names if id(named[n]) not in groups[name]] == []
    before = {n: named[n].detach().clone() for names in embedding.values() for n in names}
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    for _ in range(2):  # lora_embedding_A starts at zero: lora_embedding_B gets a gradient from the second step
        optimizer.zero_grad()
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
    changed = {n for n, value in before.items() if not torch.equal(named[n], value)}
    assert changed == set(embedding["coder"])  # the active adapter's, every one; the other's untouched


def _drop(engine, name: str):
    """``engine`` selects every adapter's tensors but ``name``."""
    select = engine._adapter_params
    engine._adapter_params = lambda module, adapter: [p for p in select(module, adapter) if p is not module.get_parameter(name)]


def _every_adapter_in_each_group(engine):
    engine._adapter_params = lambda module, adapter: [p for n, p in module.named_parameters() if ".lora_" in n]


@pytest.mark.parametrize(
    "spoil, lora, message",
    [
        (lambda engine, model: _drop(engine, "base_model.model.model.embed_tokens.lora_embedding_B.tester"), {},
         "embed_tokens.lora_embedding_B.tester: a tensor of adapter tester (requires_grad=False) in the optimizer groups []"),
        (lambda engine, model: _every_adapter_in_each_group(engine), {},
         "embed_tokens.lora_embedding_A.coder: a tensor of adapter coder (requires_grad=True) in the optimizer groups ['coder', 'tester']"),
        (lambda engine, model: model.base_model.model.lm_head.weight.requires_grad_(True), {},
         "lm_head.weight: a tensor of the base (requires_grad=True) in the optimizer groups []"),
        (lambda engine, model: None, {"modules_to_save": ["lm_head"]},
         "lm_head.modules_to_save.coder.weight: a tensor of adapter coder (requires_grad=True) in the optimizer groups []"),
    ],
    ids=["left-out", "in-two-groups", "trainable-base", "modules-to-save"],
)
def test_the_start_up_check_names_a_tensor_outside_its_adapters_group(tiny_model_dir, spoil, lora, message):
    engine, model = _engine(tiny_model_dir, ["embed_tokens", "q_proj"], **lora)
    spoil(engine, model)
    with pytest.raises(ValueError) as error:
        engine._build_optimizer(model)
    assert message in str(error.value), str(error.value)
