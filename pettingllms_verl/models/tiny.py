"""Deterministic tiny model + tokenizer for offline runs, CI and the CPU quickstart.

``python -m pettingllms_verl.models.tiny --out DIR [--seed 0]`` writes a byte-level BPE tokenizer
(ChatML chat template) trained on text the environments produce, and a randomly initialised
``Qwen2ForCausalLM`` (head_dim 64: some attention kernels reject smaller heads). Same seed and same
package version give byte-identical files; nothing is downloaded.

``--warm-start plan_path`` then fine-tunes it briefly (supervised) on well-formed replies with
*random* moves, for every role of that environment. A random model never produces a parseable
reply, so every branch gets the same parse penalty and RL has no signal; the warm model speaks
the answer format but knows nothing of the task, so rewards vary and learning can be measured.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from collections.abc import Sequence
from dataclasses import dataclass

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# A second model family for mixed teams (docs/policies.md): other special tokens, another template and
# vocabulary, so that no token id means the same in both. Role tags are plain text here, as in Llama 2.
BRACKET_TEMPLATE = (
    "{{ '<s>' }}{% for message in messages %}"
    "{{ '[' + message['role'] | upper + '] ' + message['content'] + '</s>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '[ASSISTANT] ' }}{% endif %}"
)


@dataclass(frozen=True)
class Family:
    """A tokenizer family: its special tokens, what ends a reply, what pads, and its chat template."""

    special: tuple[str, ...]
    eos: str
    pad: str
    template: str
    vocab_size: int  # the default BPE vocabulary (incl. 256 bytes)


FAMILIES = {
    "chatml": Family(tuple(SPECIAL_TOKENS), "<|im_end|>", "<|endoftext|>", CHATML_TEMPLATE, 1024),
    "bracket": Family(("</s>", "<pad>", "<s>"), "</s>", "<pad>", BRACKET_TEMPLATE, 768),
}
DEFAULT_CONFIG = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                      intermediate_size=256, max_position_embeddings=4096)


def corpus(seed: int, episodes_per_env: int = 20) -> list[str]:
    """Training text for the tokenizer: observations of every registered environment, plus
    digits, moves and Python, so prompts and plausible replies tokenise compactly."""
    from pettingllms_verl import envs
    from pettingllms_verl.targets import TargetError

    texts = []
    for name in envs.available():
        try:
            env = envs.make(name)
        except TargetError:
            continue  # an environment whose optional dependency is absent adds no text
        for episode in range(episodes_per_env):
            env.reset(seed=seed * 100_003 + episode)
            for role in env.roles:
                texts.extend(message["content"] for message in env.observation(role))
    rng = random.Random(seed)
    for _ in range(2000):
        texts.append(" ".join(str(rng.randint(0, 999)) for _ in range(8)))
        texts.append(",".join(rng.choice("UDLR") for _ in range(rng.randint(1, 12))))
    texts.append("def solve():\n    moves = []\n    for i in range(10):\n        print(i, end=' ')\n    return moves\n")
    texts.append("import sys\nprint(sys.stdin.read().strip())\n```python\n```\n\\boxed{42}")
    return texts


def build_tokenizer(seed: int, vocab_size: int, family: str = "chatml"):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    spec = FAMILIES[family]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(spec.special),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(seed), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=spec.eos,
        pad_token=spec.pad,
        bos_token=None,
        chat_template=spec.template,
        model_max_length=DEFAULT_CONFIG["max_position_embeddings"],
    )


def build(out_dir: str, seed: int = 0, vocab_size: int | None = None, family: str = "chatml", **config_overrides) -> str:
    """Write tokenizer + model to ``out_dir``; returns ``out_dir``. ``family``: a key of ``FAMILIES``
    (its default vocabulary size unless ``vocab_size`` is given)."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    if family not in FAMILIES:
        raise ValueError(f"tiny model: no tokenizer family {family!r}; known: {sorted(FAMILIES)}")
    tokenizer = build_tokenizer(seed, vocab_size or FAMILIES[family].vocab_size, family)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        torch_dtype="float32",
        **{**DEFAULT_CONFIG, **config_overrides},
    )
    if config.hidden_size // config.num_attention_heads != 64:
        raise ValueError("tiny model: hidden_size / num_attention_heads must be 64 (head_dim)")
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=[config.eos_token_id, tokenizer.pad_token_id],
        pad_token_id=tokenizer.pad_token_id,
    )
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    with open(os.path.join(out_dir, "tiny_model.json"), "w") as f:
        json.dump({"seed": seed, "family": family, "vocab_size": len(tokenizer), "parameters": model.num_parameters()}, f)
    return out_dir


def _random_moves(rng: random.Random) -> str:
    return " ".join(rng.choice("UDLR") for _ in range(rng.randint(1, 4)))


def _python(body: str) -> str:
    return f"```python\n{body}\n```"


# Short stdin programs, each right for some problems of the code fixture and wrong for the others.
STDIN_PROGRAMS = (
    "print(input())",
    "print(input()[::-1])",
    "print(len(input()))",
    "print(sum(map(int, input().split())))",
    "a, b = map(int, input().split())\nprint(a * b)",
    "print(max(map(int, input().split())))",
)


def _io_test(rng: random.Random) -> str:
    a, b = rng.randint(0, 99), rng.randint(0, 99)
    return f"<input>\n{a} {b}\n</input>\n<output>\n{rng.choice([a + b, a * b, max(a, b)])}\n</output>"


# Well-formed replies with random content, per role of each environment that supports warm starts:
# the policy starts out parsing, and which replies score is left to RL.
WARM_REPLIES = {
    "plan_path": {
        "plan": lambda rng: f"<answer>{_random_moves(rng)}</answer>",
        "tool": lambda rng: _python(f"print('{_random_moves(rng)}')"),
    },
    "math": {
        "tool": lambda rng: _python(f"print({rng.randint(1, 60)} * {rng.randint(1, 9)})"),
        "reasoner": lambda rng: f"\\boxed{{{rng.randint(0, 120)}}}",
    },
    "code": {
        "tester": _io_test,
        "coder": lambda rng: _python(rng.choice(STDIN_PROGRAMS)),
    },
}


# Optimiser steps per env: a code fence around a program takes longer to learn than a move list.
# Code: after 400 steps about a quarter of sampled programs were one of STDIN_PROGRAMS, the rest
# garbled; after 1,000 about 85 % (3.5 min on 2 cores).
WARM_STEPS = {"plan_path": 150, "math": 400, "code": 1000}


def warm_start(out_dir: str, env_name: str, seed: int = 0, steps: int | None = None, batch_size: int = 8, lr: float = 3e-3,
               image_roles: Sequence[str] = ()) -> None:
    """Supervised fine-tuning of the model in ``out_dir`` (in place) on ``WARM_REPLIES[env_name]``,
    for ``steps`` optimiser steps (default ``WARM_STEPS[env_name]``). ``image_roles``: for a
    vision-language model (models/tiny_vl.py), the roles shown the state as an image in every other
    pair of episodes (the env option ``image_roles``), so that the model answers in format whether
    its prompt holds the image or the text grid."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoProcessor, AutoTokenizer

    from pettingllms_verl import envs
    from pettingllms_verl.envs.images import chat_inputs

    if env_name not in WARM_REPLIES:
        raise ValueError(f"--warm-start: no reply format for {env_name!r}; known: {sorted(WARM_REPLIES)}")
    steps = steps or WARM_STEPS[env_name]
    processor = AutoProcessor.from_pretrained(out_dir) if image_roles else None
    tokenizer = processor.tokenizer if processor else AutoTokenizer.from_pretrained(out_dir)
    model = (AutoModelForImageTextToText if image_roles else AutoModelForCausalLM).from_pretrained(out_dir, dtype=torch.float32)
    rng = random.Random(seed)
    torch.manual_seed(seed)
    replies = WARM_REPLIES[env_name]
    examples = []  # (the prompt's model inputs, reply maker)
    for episode in range(64):
        # SA and MAS episodes played out with the warm replies themselves, so that later prompts
        # carry the other roles' replies and results, as they do in a real episode
        env = envs.make(env_name, **({"image_roles": list(image_roles)} if image_roles and episode // 2 % 2 else {}))
        workflow = env.workflow(("sa", "mas")[episode % 2])
        env.reset(seed=10_000_000 + seed * 1000 + episode)  # outside every data_prep split's seed range
        for _ in range(workflow.max_turns):
            for role in workflow.turn_order:
                if env.done:
                    break
                examples.append((chat_inputs(tokenizer, processor, env.observation(role)), replies[role]))
                env.step(role, replies[role](rng))
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    for step in range(steps):
        rows, images = [], []
        for inputs, reply in rng.sample(examples, batch_size):
            prompt, target = inputs["input_ids"], tokenizer.encode(reply(rng)) + [tokenizer.eos_token_id]
            rows.append((prompt + target, [-100] * len(prompt) + target))
            images += [inputs] if "pixel_values" in inputs else []
        width = max(len(ids) for ids, _ in rows)
        input_ids = torch.tensor([ids + [tokenizer.pad_token_id] * (width - len(ids)) for ids, _ in rows])
        labels = torch.tensor([lab + [-100] * (width - len(lab)) for _, lab in rows])
        attention_mask = (torch.arange(width)[None, :] < torch.tensor([len(ids) for ids, _ in rows])[:, None]).long()
        # the batch's images in row order: the vision tower fills the image tokens in that order
        pixels = {key: torch.cat([inputs[key] for inputs in images]) for key in ("pixel_values", "image_grid_thw")} if images else {}
        if images:  # which positions are image tokens: multimodal RoPE reads it (1 an image's, 0 text)
            pixels["mm_token_type_ids"] = (input_ids == model.config.image_token_id).long()
        loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels, **pixels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if step % 50 == 0 or step == steps - 1:
            print(f"warm start {env_name}: step {step + 1}/{steps} loss {loss.item():.3f}", file=sys.stderr)
    model.save_pretrained(out_dir)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="directory to write the model and tokenizer to")
    parser.add_argument("--seed", type=int, default=0, help="seed of tokenizer corpus and weights")
    parser.add_argument("--vocab-size", type=int, help="BPE vocabulary size (incl. 256 bytes; default: the family's)")
    parser.add_argument("--family", default="chatml", choices=sorted(FAMILIES), help="tokenizer family: special tokens, chat template, vocabulary")
    parser.add_argument("--config", default="{}", help='model config overrides as JSON, e.g. \'{"num_hidden_layers": 4}\'')
    parser.add_argument("--warm-start", metavar="ENV", help=f"then fine-tune on well-formed replies of ENV ({', '.join(WARM_REPLIES)})")
    args = parser.parse_args(argv)
    build(args.out, seed=args.seed, vocab_size=args.vocab_size, family=args.family, **json.loads(args.config))
    if args.warm_start:
        warm_start(args.out, args.warm_start, seed=args.seed)
    print(f"tiny model written to {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
