"""Resident memory of the hf rollout engine over training steps, with and without handing freed
memory back to the system after each call (``engine.release_freed_memory``, glibc's malloc_trim).

The real model (SmolLM2-135M-Instruct: ``make real-model``) with two LoRA adapters folded into the
rollout's weights, as ``plan_path_mas_lora_smollm2_cpu`` serves them: each "step" refreshes both
adapters (new tensors, as the trainer's sync sends them) and runs four calls of varied rows,
prompt lengths and reply lengths (a fixed random sequence, the same in both settings) on an
executor thread, as the server does. Each setting runs in a fresh process; its resident set size
(RSS) is read after every step (between steps: "most after a step" is no peak within a call).

    python benchmarks/bench_rollout_memory.py [--steps 10] [--out benchmarks/results/rollout_memory.json]
"""

import argparse
import concurrent.futures
import json
import os
import random
import subprocess
import sys

LORA = {"r": 8, "lora_alpha": 16, "init_lora_weights": False,
        "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}


def rss_mb() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def run(steps: int, release: bool) -> list[float]:
    """One setting in this process: RSS (MB) at the start, then after each step."""
    import torch
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pettingllms_verl.backends.hf import engine as hf_engine
    from pettingllms_verl.models import smollm2

    torch.set_num_threads(1)
    if not release:
        hf_engine._MALLOC_TRIM = None
    path = os.path.join(smollm2.artifacts_dir(), smollm2.FOLDER)
    if not os.path.isfile(os.path.join(path, "config.json")):
        sys.exit(f"{path}: the real model is not converted; run `make real-model` (or set PETTINGLLMS_ARTIFACTS to the folder that holds it)")
    engine = hf_engine.HFGenerationEngine(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval(),
                                          AutoTokenizer.from_pretrained(path), merge_adapters=True)
    trainer = get_peft_model(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), LoraConfig(**LORA), adapter_name="plan")
    trainer.add_adapter("tool", LoraConfig(**LORA))
    rng = random.Random(0)
    server = concurrent.futures.ThreadPoolExecutor(1)  # the server's engine calls run on an executor thread
    sizes = [rss_mb()]
    for step in range(steps):
        for name in ("plan", "tool"):
            state = {key: value + 0.01 * torch.randn_like(value) for key, value in get_peft_model_state_dict(trainer, adapter_name=name).items()}
            server.submit(engine.load_adapter, name, state, LORA).result()
        for name in ("tool", "plan", "tool", "plan"):
            rows, length, new = rng.choice([8, 16, 32]), rng.choice([150, 300, 400]), rng.choice([24, 48, 96])
            prompts = [[rng.randrange(100, 40000) for _ in range(length)] for _ in range(rows // 4)] * 4  # K = 4 rows a prompt
            server.submit(engine.generate, prompts, [hf_engine.SamplingSpec(max_tokens=new)] * rows, [name] * rows).result()
        sizes.append(rss_mb())
        print(f"  {'released' if release else 'kept'}: step {step + 1}: {sizes[-1]:.0f} MB", file=sys.stderr, flush=True)
    return sizes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--out", default="benchmarks/results/rollout_memory.json")
    parser.add_argument("--child", choices=["released", "kept"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run(args.steps, args.child == "released")))
        return
    results = {}
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    for setting in ("kept", "released"):
        print(f"{setting}: a fresh process, {args.steps} steps", flush=True)
        child = subprocess.run([sys.executable, __file__, "--steps", str(args.steps), "--child", setting], stdout=subprocess.PIPE, text=True)
        if child.returncode != 0:
            sys.exit(f"{setting}: its process exited {child.returncode}; the settings before it are in {args.out}")
        results[setting] = json.loads(child.stdout.strip().splitlines()[-1])
        with open(args.out, "w") as out:  # after each setting: a later one that fails loses nothing finished
            json.dump({"steps": args.steps, "rss_mb": results}, out, indent=1)
    print("\n| freed memory after each call | RSS at start (MB) | after step 1 | after the last step | most after a step |")
    print("|---|---|---|---|---|")
    for setting, sizes in results.items():
        what = "handed back (malloc_trim)" if setting == "released" else "kept by the allocator"
        print(f"| {what} | {sizes[0]:.0f} | {sizes[1]:.0f} | {sizes[-1]:.0f} | {max(sizes):.0f} |")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
