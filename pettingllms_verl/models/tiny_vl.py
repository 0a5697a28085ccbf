"""Deterministic tiny vision-language model + processor for offline runs and CI.

``python -m pettingllms_verl.models.tiny_vl --out DIR [--seed 0]`` writes a randomly initialised
``Qwen2VLForConditionalGeneration`` (the Qwen2-VL architecture that verl and vLLM serve: a one-block
vision tower, the tiny text model's width and depth) with its processor: the tiny byte-level BPE
tokenizer plus Qwen2-VL's vision tokens, a ChatML template that renders image parts of a message
as ``<|vision_start|><|image_pad|><|vision_end|>``, and Qwen2-VL's image processor bounded to one
pixel count, so that a drawn (square) grid always becomes the same few image tokens. Same seed, same files;
nothing is downloaded.

``--warm-start plan_path`` then fine-tunes it on well-formed replies (models/tiny.py), every role
shown the grid as an image in half the episodes and as text in the others: random weights never write
a parseable reply, so a vision run from them has no reward signal; the warm model answers in format
whatever its prompt holds, and which answers score is left to RL.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from pettingllms_verl import envs
from pettingllms_verl.models import tiny
from pettingllms_verl.models.tiny import DEFAULT_CONFIG, WARM_REPLIES, build_tokenizer

VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
# ChatML, where a message's content may be a list of parts ({"type": "image"} or {"type": "text", "text": ...})
CHATML_VL_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
PATCH, MERGE, TEMPORAL = 14, 2, 2  # Qwen2-VL's patch size, spatial merge and temporal patch
IMAGE_SIDE = 84  # every image is resized to 84 x 84 pixels' worth, its aspect kept: a square one to 84 x 84, (84 / 14)^2 / 2^2 = 9 image tokens
VISION_CONFIG = dict(depth=1, embed_dim=32, num_heads=2, mlp_ratio=2, patch_size=PATCH, spatial_merge_size=MERGE,
                     temporal_patch_size=TEMPORAL, in_channels=3)


def image_tokens(side: int = IMAGE_SIDE) -> int:
    """Image tokens one image becomes in the prompt (after the processor's resize to ``side``)."""
    return (side // PATCH) ** 2 // MERGE**2


def build_processor(seed: int, vocab_size: int):
    from transformers import Qwen2VLImageProcessor, Qwen2VLProcessor, Qwen2VLVideoProcessor

    tokenizer = build_tokenizer(seed, vocab_size)
    tokenizer.add_special_tokens({"additional_special_tokens": VISION_TOKENS})
    tokenizer.chat_template = CHATML_VL_TEMPLATE
    pixels = IMAGE_SIDE * IMAGE_SIDE
    image_processor = Qwen2VLImageProcessor(
        patch_size=PATCH, merge_size=MERGE, temporal_patch_size=TEMPORAL, size={"shortest_edge": pixels, "longest_edge": pixels},
    )
    video_processor = Qwen2VLVideoProcessor(patch_size=PATCH, merge_size=MERGE, temporal_patch_size=TEMPORAL)  # unused, but part of the processor
    return Qwen2VLProcessor(image_processor=image_processor, tokenizer=tokenizer, video_processor=video_processor,
                            chat_template=CHATML_VL_TEMPLATE)


def build(out_dir: str, seed: int = 0, vocab_size: int = 1024) -> str:
    """Write processor + model to ``out_dir``; returns ``out_dir``."""
    import torch
    from transformers import GenerationConfig, Qwen2VLConfig, Qwen2VLForConditionalGeneration

    processor = build_processor(seed, vocab_size)
    tokenizer = processor.tokenizer
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in VISION_TOKENS}
    head_dim = DEFAULT_CONFIG["hidden_size"] // DEFAULT_CONFIG["num_attention_heads"]
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    text = dict(DEFAULT_CONFIG, vocab_size=len(tokenizer), eos_token_id=eos, pad_token_id=tokenizer.pad_token_id, bos_token_id=None,
                tie_word_embeddings=False,
                # multimodal RoPE: the (time, height, width) sections of the rotary half-dimension
                rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0, "mrope_section": [head_dim // 8, 3 * head_dim // 16, 3 * head_dim // 16]})
    config = Qwen2VLConfig(
        text_config=text, vision_config=dict(VISION_CONFIG, hidden_size=DEFAULT_CONFIG["hidden_size"]),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False, torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = Qwen2VLForConditionalGeneration(config)
    model.generation_config = GenerationConfig(eos_token_id=[eos, tokenizer.convert_tokens_to_ids("<|endoftext|>")],
                                               pad_token_id=tokenizer.pad_token_id)
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir)
    processor.save_pretrained(out_dir)
    with open(os.path.join(out_dir, "tiny_model.json"), "w") as f:
        json.dump({"seed": seed, "vocab_size": len(tokenizer), "parameters": model.num_parameters(), "image_tokens": image_tokens()}, f)
    return out_dir


def warm_start(out_dir: str, env_name: str, seed: int = 0) -> None:
    """``tiny.warm_start`` of the model in ``out_dir`` with every role of ``env_name`` shown the
    state as an image in half the episodes: it answers in format whichever roles a recipe shows images."""
    tiny.warm_start(out_dir, env_name, seed=seed, image_roles=envs.env_class(env_name).roles)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="directory to write the model and processor to")
    parser.add_argument("--seed", type=int, default=0, help="seed of tokenizer corpus and weights")
    parser.add_argument("--vocab-size", type=int, default=1024, help="BPE vocabulary size (incl. 256 bytes)")
    drawn = [name for name in WARM_REPLIES if "image_roles" in envs.env_class(name).options]  # the environments that draw their state
    parser.add_argument("--warm-start", metavar="ENV", choices=drawn,
                        help=f"then fine-tune on well-formed replies of ENV ({', '.join(drawn)}), every role shown the state as an image in half the episodes")
    args = parser.parse_args(argv)
    build(args.out, seed=args.seed, vocab_size=args.vocab_size)
    if args.warm_start:
        warm_start(args.out, args.warm_start, seed=args.seed)
    print(f"tiny vision-language model written to {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
