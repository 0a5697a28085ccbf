"""Step time of a role that sees against the same role reading text.

Plan-Path MAS AT-GRPO through ``python -m verl.trainer.main_ppo`` with the tiny Qwen2-VL model
(``plan_path_mas_atgrpo_vision_cpu``: the plan agent shown the 6x6 grid as an 84 x 84 image, 9 image
tokens), against the same recipe, model and rows with ``image_roles=[]`` (the plan agent reads the
grid as text). Per mode: the mean ``timing_s/step`` of the steps after the first, its parts
(generation, old log-probs, update), the mean prompt length of a row (a plan row and a tool row
alternate) and the peak memory of the trainer and rollout processes (``bench_policies.run``).
Runs in the vLLM tier's environment, whose torchvision Qwen2-VL's processor needs:

    .venv-vllm/bin/python benchmarks/bench_vision.py [--steps 4] [--out benchmarks/results/vision.json]
"""

import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_policies import PARTS, REPO, prepare, run  # noqa: E402

RECIPE = "plan_path_mas_atgrpo_vision_cpu"
MODES = {"text": ["pettingllms.env_kwargs.image_roles=[]"], "image": []}  # mode -> overrides of RECIPE


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=4, help="training steps per run (the first is not timed)")
    parser.add_argument("--out", default=os.path.join(REPO, "benchmarks", "results", "vision.json"))
    args = parser.parse_args()
    from pettingllms_verl.models.tiny_vl import build, image_tokens

    root = tempfile.mkdtemp(prefix="bench_vision_")
    prepare(root, [])  # the Plan-Path 6x6 splits
    model = build(os.path.join(root, "tiny_vl_model"), seed=0)
    print(f"image tokens per plan prompt: {image_tokens()}")
    print(f"{'mode':<6} {'step s':>8} " + " ".join(f"{part + ' s':>14}" for part in PARTS) + f" {'prompt tok':>11} {'trainer GiB':>12} {'rollout GiB':>12} "
                                                                                             f"{'step/text':>10}", flush=True)
    rows = []
    for mode, overrides in MODES.items():
        figures = {"mode": mode, **run(root, RECIPE, overrides, model, args.steps)}
        figures["step_vs_text"] = figures["step_s"] / rows[0]["step_s"] if rows else 1.0
        rows.append(figures)
        print(f"{mode:<6} {figures['step_s']:>8.2f} " + " ".join(f"{figures[part + '_s']:>14.2f}" for part in PARTS)
              + f" {figures['prompt_tokens']:>11.1f} {figures['trainer_gib']:>12.2f} {figures['rollout_gib']:>12.2f}"
              + f" {figures['step_vs_text']:>9.2f}x", flush=True)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"image_tokens_per_image": image_tokens(), "rows": rows}, f, indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
