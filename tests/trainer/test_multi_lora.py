"""Each LoRA adapter's optimizer group holds exactly the tensors peft holds for it (embedding LoRA
and DoRA included), and the start-up check names any tensor that would train outside its group.
The engine's adapter and optimizer methods run on the peft model alone (no process group, no FSDP),
but for the embedding and LM-head adapters' run in verl's FSDP2 engine."""

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


def test_embedding_and_lm_head_adapters_train_in_verls_fsdp2_engine(tiny_model_dir):
    """The tiny model's embeddings are untied, so verl's FSDP2 would wrap the peft-adapted
    ``embed_tokens`` and ``lm_head`` on their own (and fail); they stay in the root unit, and two
    optimizer steps change every tensor of the active adapter there and none of the other's."""
    from torch.distributed.fsdp import FSDPModule

    from pettingllms_verl.config import AdapterConfig
    from support.local_engine import local_engine, no_padding_batch

    spec = {**AdapterConfig(rank=4, alpha=8, target_modules=["embed_tokens", "q_proj", "lm_head"]).lora_config(),
            "path": None, "trainable": True}
    engine = local_engine(tiny_model_dir, engine_cls=MultiLoRAFSDPEngine, lr=1e-3, adapters={name: dict(spec) for name in ADAPTERS})
    units = [name for name, module in engine.module.named_modules() if isinstance(module, FSDPModule)]
    assert units == ["", "base_model.model.model.layers.0", "base_model.model.model.layers.1"]
    named = dict(engine.module.named_parameters())
    outer = [n for n in named if ".embed_tokens.lora_" in n or ".lm_head.lora_" in n]
    assert len(outer) == 4 * len(ADAPTERS), outer
    before = {n: named[n].full_tensor().detach().clone() for n in outer}

    def loss(model_output, data, dp_group=None):
        from verl.workers.utils.padding import no_padding_2_padding

        return -(no_padding_2_padding(model_output["log_probs"], data) * data["response_mask"]).sum(), {}

    batch = no_padding_batch([[5, 6, 7, 8], [9, 10, 11]], [[12, 13], [14, 15, 16]], micro_batch_size_per_gpu=2)
    for _ in range(2):  # lora_embedding_A starts at zero: lora_embedding_B gets a gradient from the second step
        engine.optimizer_zero_grad()
        engine.forward_backward_batch(batch, loss_function=loss, forward_only=False)
        engine.optimizer_step()
    changed = {n for n, value in before.items() if not torch.equal(named[n].full_tensor(), value)}
    assert changed == {n for n in outer if ".coder" in n}
    # the adapter alone goes to the rollout and the export, without the base embedding and LM head
    assert [key for key in engine.adapter_state("coder") if "base_layer" in key] == []


def test_an_adapter_started_from_a_folder_that_lacks_some_of_its_tensors_is_refused(tiny_model_dir, tmp_path):
    """A peft folder whose tensors cover only part of the adapter would leave the rest as initialised
    (``lora_B`` zero: the base model) and train or evaluate that silently."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    engine, peft_model = _engine(tiny_model_dir, ["q_proj", "v_proj"])
    state = get_peft_model_state_dict(peft_model, adapter_name="coder")
    peft_model.peft_config["coder"].save_pretrained(str(tmp_path / "whole"))
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp_path / "whole" / "adapter_model.safetensors"))
    peft_model.peft_config["coder"].save_pretrained(str(tmp_path / "part"))
    save_file({k: v.contiguous() for k, v in state.items() if "v_proj" not in k}, str(tmp_path / "part" / "adapter_model.safetensors"))
    for folder, refused in (("whole", False), ("part", True)):
        from transformers import AutoModelForCausalLM

        adapters = engine.model_config["lora"][next(iter(engine.model_config["lora"]))]
        adapters["coder"]["path"] = str(tmp_path / folder)
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
        if refused:
            with pytest.raises(ValueError, match=r"adapter coder: .*part lacks \d+ of its tensors"):
                engine._build_lora_module(model)
        else:
            engine._build_lora_module(model)
