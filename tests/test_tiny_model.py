"""The tiny model builder is deterministic and produces a loadable chat model."""

import hashlib
import os

from transformers import AutoConfig, AutoTokenizer

from pettingllms_verl.models.tiny import build


def digests(directory):
    return {
        name: hashlib.sha256(open(os.path.join(directory, name), "rb").read()).hexdigest()
        for name in sorted(os.listdir(directory))
    }


def test_same_seed_same_files_other_seed_other_weights(tiny_model_dir, tmp_path):
    again = build(str(tmp_path / "again"), seed=0)
    assert digests(again) == digests(tiny_model_dir)
    other = build(str(tmp_path / "other"), seed=1)
    assert digests(other)["model.safetensors"] != digests(tiny_model_dir)["model.safetensors"]


def test_head_dim_64_and_chatml_template(tiny_model_dir):
    config = AutoConfig.from_pretrained(tiny_model_dir)
    assert config.hidden_size // config.num_attention_heads == 64
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.eos_token == "<|im_end|>" and config.eos_token_id == tokenizer.eos_token_id
    assert len(tokenizer) == config.vocab_size
