"""The tiny model builder is deterministic and produces a loadable chat model."""

import hashlib
import os
import random

from omegaconf import OmegaConf
from transformers import AutoConfig, AutoTokenizer

from pettingllms_verl.envs import make
from pettingllms_verl.models.tiny import WARM_REPLIES, WARM_STEPS, build

from support import RECIPES



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


def test_warm_start_replies_parse_and_fit_their_cpu_recipes_token_budget(tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    rng = random.Random(0)
    assert set(WARM_STEPS) == set(WARM_REPLIES)
    for env_name, replies in WARM_REPLIES.items():
        roles = OmegaConf.load(os.path.join(RECIPES, f"{env_name}_mas_atgrpo_cpu.yaml")).pettingllms.roles
        env = make(env_name)
        for seed in range(10):
            env.reset(seed=seed)
            for role, reply in replies.items():
                text = reply(rng)
                assert env.clone().step(role, text).parse_ok, (env_name, role, text)
                assert len(tokenizer.encode(text)) + 1 <= roles[role].sampling.max_tokens, (env_name, role, text)  # + EOS
