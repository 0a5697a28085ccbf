"""Step time and peak memory of one shared policy (L0) vs a LoRA adapter per role (L1) vs a full
model per role (L2).

Runs Plan-Path MAS AT-GRPO through ``python -m verl.trainer.main_ppo`` for a few steps per
configuration (``plan_path_mas_atgrpo_cpu`` for L0, ``plan_path_mas_lora_cpu`` for L1 with two
adapters, and with four (two more, resident and synced every step but serving no role: the
preflight, which refuses a policy no role uses, is off for that run), ``plan_path_mas_full_cpu``
for L2 with two models; all with 2 optimizer steps per policy per training step, on the same
rows), on the warm-started tiny model and on a random ~100M-parameter model with the same
tokenizer. While a run goes, the resident memory of its Ray processes is sampled every 0.5 s and
summed per kind: trainer workers (``WorkerDict``: FSDP actor, optimizer) and rollout servers
(``HFRolloutServer``). Step time is the mean ``timing_s/step`` of the run's steps after the first;
with PPO, the critics' share is that of ``timing_s/values`` + ``timing_s/update_critic`` in it (a
critic lives in its policy's trainer process, so its memory is in the trainer column).

    python benchmarks/bench_policies.py [--steps 3] [--models tiny,100m] [--modes "L2 (2 models),L2 (2 families)"] [--out ...]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading

import psutil

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODES = {  # name -> (recipe, extra overrides)
    "L0": ("plan_path_mas_atgrpo_cpu", []),
    "L1 (2 adapters)": ("plan_path_mas_lora_cpu", []),
    "L1 (4 adapters)": ("plan_path_mas_lora_cpu", [
        "~hydra.callbacks.preflight", "+pettingllms.policies.spare_one.adapter.rank=8", "+pettingllms.policies.spare_two.adapter.rank=8",
    ]),
    "L2 (2 models)": ("plan_path_mas_full_cpu", []),
    # the same team with the planner on a second tokenizer family (models.tiny --family bracket, the
    # same architecture and vocabulary size, warm-started alike): what mixing families costs
    "L2 (2 families)": ("plan_path_mas_full_cpu", ["+pettingllms.policies.plan_policy.overrides.model.path={family_b}"]),
    # PPO with a critic per policy on the same rows (docs/training.md): the critics' share of the step
    "L0 + PPO": ("plan_path_mas_atgrpo_cpu", ["algorithm.adv_estimator=gae"]),
    "L2 + PPO": ("plan_path_mas_full_cpu", ["algorithm.adv_estimator=gae"]),
}
KINDS = {"trainer": "WorkerDict", "rollout": "HFRolloutServer"}
PARTS = ("gen", "old_log_prob", "update_actor")  # a step's parts (timing_s/<part>), averaged like the step
# ~100M parameters: 12 layers of hidden 768 (head_dim 64), MLP 2048, the tiny tokenizer's 1024 tokens
MODEL_100M = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, num_key_value_heads=12, intermediate_size=2048)


def prepare(root: str, models: list[str]) -> dict[str, str]:
    from pettingllms_verl.data.rows import write_parquet
    from pettingllms_verl.envs.splits import generate_splits
    from pettingllms_verl.models.tiny import build, warm_start

    for split, rows in generate_splits("plan_path", {"train": 64, "val": 4, "test": 4}, {"size": 6}, log=lambda _: None).items():
        write_parquet(rows, os.path.join(root, "data", "plan_path_6x6", f"{split}.parquet"))
    paths = {}
    if "tiny" in models:
        paths["tiny"] = os.path.join(root, "tiny_model_plan_path")
        warm_start(build(paths["tiny"], seed=0), "plan_path", seed=0)
        warm_start(build(family_b(paths["tiny"]), seed=0, family="bracket", vocab_size=1024), "plan_path", seed=0)
    if "100m" in models:
        paths["100m"] = build(os.path.join(root, "model_100m"), seed=0, **MODEL_100M)
        build(family_b(paths["100m"]), seed=0, family="bracket", vocab_size=1024, **MODEL_100M)
    return paths


def family_b(path: str) -> str:
    """Where a model's second-family twin is built (``L2 (2 families)``)."""
    return f"{path}_bracket"


def peak_memory(stop: threading.Event, peaks: dict[str, float]) -> None:
    """Peak of the summed RSS (GiB) of each kind of Ray process, sampled until ``stop``."""
    while not stop.is_set():
        totals = dict.fromkeys(KINDS, 0.0)
        for proc in psutil.process_iter(["cmdline", "memory_info"]):
            command = " ".join(proc.info["cmdline"] or [])
            for kind, marker in KINDS.items():
                if command.startswith("ray::") and marker in command and proc.info["memory_info"]:
                    totals[kind] += proc.info["memory_info"].rss / 2**30
        for kind, value in totals.items():
            peaks[kind] = max(peaks.get(kind, 0.0), value)
        stop.wait(0.5)


def run(root: str, recipe: str, overrides: list[str], model: str, steps: int) -> dict:
    log = os.path.join(root, f"{recipe}_{len(overrides)}_{os.path.basename(model)}.jsonl")
    command = [
        sys.executable, "-m", "verl.trainer.main_ppo", "--config-path", os.path.join(REPO, "recipes"),
        "--config-name", recipe, f"trainer.total_training_steps={steps}", f"actor_rollout_ref.model.path={model}",
        "trainer.save_freq=-1", "trainer.resume_mode=disable",
        "++pettingllms.trainer.mini_batches_per_step=2",  # the same optimizer work per policy in every mode
        *(override.format(family_b=family_b(model)) for override in overrides),
    ]
    peaks: dict[str, float] = {}
    stop = threading.Event()
    sampler = threading.Thread(target=peak_memory, args=(stop, peaks), daemon=True)
    sampler.start()
    env = {**os.environ, "PETTINGLLMS_ARTIFACTS": root, "VERL_FILE_LOGGER_PATH": log, "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True)
    stop.set()
    sampler.join()
    if result.returncode != 0:
        sys.exit(f"{recipe} on {model} failed:\n{result.stderr[-3000:]}")
    steps_logged = [json.loads(line)["data"] for line in open(log)][1:]
    step_s = sum(step["timing_s/step"] for step in steps_logged) / len(steps_logged)
    critic_s = sum(step.get("timing_s/values", 0.0) + step.get("timing_s/update_critic", 0.0) for step in steps_logged) / len(steps_logged)
    parts = {f"{part}_s": sum(step.get(f"timing_s/{part}", 0.0) for step in steps_logged) / len(steps_logged) for part in PARTS}
    prompt_tokens = sum(step["prompt_length/mean"] for step in steps_logged) / len(steps_logged)
    return {"step_s": step_s, "critic_frac": critic_s / step_s, **parts, "prompt_tokens": prompt_tokens,
            **{f"{kind}_gib": peaks.get(kind, 0.0) for kind in KINDS}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=3, help="training steps per run (the first is not timed)")
    parser.add_argument("--models", default="tiny,100m", help="comma-separated: tiny, 100m")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, from: {', '.join(MODES)} (L0 first: the ratios)")
    parser.add_argument("--out", default=os.path.join(REPO, "benchmarks", "results", "policies.json"))
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="bench_policies_")
    models = prepare(root, args.models.split(","))
    rows = []
    modes = args.modes.split(",")
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        sys.exit(f"--modes: unknown {unknown}; from: {list(MODES)}")
    print(f"{'model':<6} {'mode':<16} {'step s':>8} {'critic':>7} {'trainer GiB':>12} {'rollout GiB':>12} {'step/L0':>8} {'memory/L0':>10}", flush=True)
    for model_name, path in models.items():
        l0 = None
        for mode in modes:
            recipe, overrides = MODES[mode]
            figures = {"model": model_name, "mode": mode, **run(root, recipe, overrides, path, args.steps)}
            l0 = l0 or figures
            figures["step_vs_l0"] = figures["step_s"] / l0["step_s"]
            figures["memory_vs_l0"] = (figures["trainer_gib"] + figures["rollout_gib"]) / (l0["trainer_gib"] + l0["rollout_gib"])
            rows.append(figures)
            print(f"{model_name:<6} {mode:<16} {figures['step_s']:>8.2f} {figures['critic_frac']:>7.1%} {figures['trainer_gib']:>12.2f} "
                  f"{figures['rollout_gib']:>12.2f} "
                  f"{figures['step_vs_l0']:>7.2f}x {figures['memory_vs_l0']:>9.2f}x", flush=True)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(rows, f, indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
