"""The critic's pieces that need no Ray: the explained variance per policy and the value-model loader."""

import pytest
import torch

from pettingllms_verl.trainer.metrics import explained_variance


def test_explained_variance_is_verls_formula_over_the_masked_response_tokens():
    returns = [torch.tensor([1.0, 1.0, 9.0]), torch.tensor([0.0, 0.0])]
    masks = [torch.tensor([1, 1, 0]), torch.tensor([1, 1])]  # the 9 is not a response token
    assert explained_variance([r.clone() for r in returns], returns, masks) == pytest.approx(1.0, abs=1e-4)  # values = returns
    constant = [torch.full((3,), 0.3), torch.full((2,), 0.3)]  # any constant explains nothing
    assert explained_variance(constant, returns, masks) == pytest.approx(0.0, abs=1e-4)
    backwards = [1 - r for r in returns]  # values that move against the returns: worse than nothing
    assert explained_variance(backwards, returns, masks) == pytest.approx(-3.0, abs=1e-3)
    ret = torch.tensor([1.0, 1.0, 0.0, 0.0])
    half = [torch.tensor([0.75, 0.75, 9.0]), torch.tensor([0.25, 0.25])]  # half of the deviation explained
    expected = 1 - torch.var(ret - torch.tensor([0.75, 0.75, 0.25, 0.25])) / (torch.var(ret) + 1e-5)
    assert explained_variance(half, returns, masks) == pytest.approx(float(expected), abs=1e-6)


def test_the_value_model_loads_with_the_configured_attention_on_a_machine_without_flash_attn(tiny_model_dir):
    """verl's loader asks for flash_attention_2 whatever the config says (it fails here, where
    flash-attn is not installed); the critic worker's loads verl's model class with the config's."""
    from transformers import AutoConfig
    from verl.utils.model import load_valuehead_model

    from pettingllms_verl.trainer.critic import load_value_model

    config = AutoConfig.from_pretrained(tiny_model_dir, attn_implementation="sdpa")
    config.num_labels = 1  # as verl's engine sets it for a value model
    with pytest.raises(RuntimeError):  # its flash_attention_2 load fails, then its trl fallback (not installed)
        load_valuehead_model(tiny_model_dir, torch.float32, config, False)
    model = load_value_model(tiny_model_dir, torch.float32, config, False)
    assert type(model).__name__.endswith("ForTokenClassification") and model.config._attn_implementation == "sdpa"
    values = model(input_ids=torch.tensor([[1, 2, 3]])).logits
    assert values.shape == (1, 3, 1)
