"""Which adapter a peft tensor belongs to, and adapters carried through a checkpoint engine's
stream of named tensors (``lora_names``): one rule for the trainer and the rollouts."""

import torch

from pettingllms_verl.lora_names import CONFIG_NAME, adapter_of, config_tensor, pushed_name, split_pushed


def test_a_tensor_belongs_to_the_adapter_named_after_its_lora_holder():
    assert adapter_of("base_model.model.layers.0.self_attn.q_proj.lora_A.tool.weight") == "tool"
    assert adapter_of("base_model.model.embed_tokens.lora_embedding_A.plan") == "plan"
    assert adapter_of("base_model.model.layers.0.self_attn.q_proj.base_layer.weight") is None


def test_adapters_pushed_in_one_stream_come_apart_with_their_configs():
    """The trainer's stream (each adapter's config, then its tensors, beside base tensors) read back
    as the rollout reads it: every tensor under its own adapter, each config as sent."""
    tool = {"r": 8, "lora_alpha": 16, "target_modules": {"q_proj", "v_proj"}}  # a set: pickled, not JSON
    a, b, base = torch.randn(8, 4), torch.randn(4, 8), torch.randn(3)
    stream = [
        (pushed_name("tool", CONFIG_NAME), config_tensor(tool)),
        (pushed_name("tool", "layers.0.q_proj.lora_A.weight"), a),
        (pushed_name("plan", CONFIG_NAME), config_tensor({"r": 4})),
        (pushed_name("plan", "layers.0/q_proj.lora_B.weight"), b),  # a "/" in a tensor's name stays in it
        ("model.norm.weight", base),
    ]
    got_base, adapters = split_pushed(dict(stream))
    assert list(got_base) == ["model.norm.weight"] and torch.equal(got_base["model.norm.weight"], base)
    assert set(adapters) == {"tool", "plan"}
    config, tensors = adapters["tool"]
    assert config == tool and list(tensors) == ["layers.0.q_proj.lora_A.weight"] and torch.equal(tensors["layers.0.q_proj.lora_A.weight"], a)
    config, tensors = adapters["plan"]
    assert config == {"r": 4} and list(tensors) == ["layers.0/q_proj.lora_B.weight"] and torch.equal(tensors["layers.0/q_proj.lora_B.weight"], b)
