"""Warm start by verl's own SFT trainer on noisy demonstrations (``models/demos.py``).

``python -m pettingllms_verl.models.sft --base DIR --out DIR`` writes the demonstrations as a
parquet of chat ``messages`` (verl's multi-turn SFT format: only the assistant reply is trained
on), runs ``verl.trainer.sft_trainer`` over them (FSDP2 on one gloo rank, fp32, through this
package's CPU platform), and copies the HF model verl saves at its last step to ``--out``. With
``--lora-rank`` it trains a LoRA adapter instead (verl's ``model.lora_rank``) and ``--out`` is the
peft adapter folder verl's ``model_merger`` exports, which a role's ``adapter.path`` starts from
(L1); ``--roles`` keeps the demonstrations of some roles only (an adapter per role). The folder
appears whole or not at all (written beside it, renamed last); an existing one is kept.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys

from pettingllms_verl.checkpoints import step_folder


# Chance of the right demonstration per kind of reply (see models/demos.py).
DEFAULT_P_CORRECT = {"tool": 0.3, "copy": 1.0, "plan": 0.3}


def sft_overrides(data: str, base: str, work: str, steps: int, batch_size: int, lr: float, seed: int,
                  lora_rank: int = 0, lora_alpha: int = 16) -> list[str]:
    """verl ``sft_trainer`` overrides for a small model on CPU (fp32, sdpa, no packing kernels); a LoRA
    adapter on every linear layer when ``lora_rank`` > 0."""
    lora = [f"model.lora_rank={lora_rank}", f"model.lora_alpha={lora_alpha}", "model.target_modules=all-linear"] if lora_rank else []
    return [*lora,
        f"data.train_files={data}",
        "data.messages_key=messages",
        f"data.train_batch_size={batch_size}",
        f"data.micro_batch_size_per_gpu={batch_size}",
        "data.use_dynamic_bsz=false",
        "data.max_length=1024",
        "data.num_workers=0",
        f"model.path={base}",
        "model.use_remove_padding=false",  # needs flash-attn varlen kernels
        "model.enable_gradient_checkpointing=false",
        "+model.override_config.attn_implementation=sdpa",
        "engine.strategy=fsdp2",  # FSDP1 fails on CPU
        "engine.dtype=float32",
        "+engine.mixed_precision={param_dtype: fp32, reduce_dtype: fp32, buffer_dtype: fp32}",
        "engine.use_torch_compile=false",
        f"engine.seed={seed}",
        f"optim.lr={lr}",
        "optim.lr_scheduler_type=cosine",
        f"trainer.total_training_steps={steps}",
        "trainer.total_epochs=1000",  # the step count ends the run
        f"trainer.seed={seed}",
        "trainer.logger=[console]",
        "trainer.device=cpu",
        "trainer.project_name=pettingllms_verl_sft",
        f"trainer.default_local_dir={work}/checkpoints",
        "trainer.resume_mode=disable",
        # a LoRA run's adapter is exported from the sharded model by verl's model_merger, not from hf_model
        "checkpoint.save_contents=[model]" if lora_rank else "checkpoint.save_contents=[model,hf_model]",
    ]


def record(base: str, rows: list[dict], **settings) -> dict:
    """What made a warm start (its ``warm_start.json``): the base model, and the base's own record when it
    is a warm start too (a change there changes this record), the demonstrations' count and digest (they
    change with the code: `make reproduce` compares records), and the SFT ``settings``."""
    base_record = os.path.join(base, "warm_start.json")
    return {"base": base, "base_warm_start": json.load(open(base_record)) if os.path.isfile(base_record) else None,
            "demonstrations": len(rows), "demonstrations_sha256": hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest(),
            **settings}


def warm_start(base: str, out: str, episodes: int = 800, p_correct: dict[str, float] | None = None, steps: int = 1200, batch_size: int = 16,
               lr: float = 3e-3, seed: int = 0, env_kwargs: dict | None = None, workflows: tuple[str, ...] = ("sa", "mas"),
               roles: tuple[str, ...] | None = None, lora_rank: int = 0, lora_alpha: int = 16) -> str:
    """SFT the model in ``base`` on ``episodes`` noisy Plan-Path demonstration episodes (the replies of
    ``roles``, default all); write it to ``out``, or with ``lora_rank`` the LoRA adapter trained on it."""
    import pandas as pd

    from pettingllms_verl.models.demos import plan_path_demos

    base, out = os.path.abspath(base), os.path.abspath(out)  # the trainer runs in a work folder
    if os.path.exists(os.path.join(out, "warm_start.json")):  # written last
        print(f"{out} exists: kept (delete it to warm-start again)", file=sys.stderr)
        return out
    if not os.path.exists(os.path.join(base, "config.json")):
        raise SystemExit(f"--base {base}: no model there (build the tiny model first: python -m pettingllms_verl.models.tiny --out {base})")
    work = out.rstrip("/") + ".sft-work"
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    p_correct = {**DEFAULT_P_CORRECT, **(p_correct or {})}
    rows = [row for row in plan_path_demos(episodes, p_correct, seed=seed, env_kwargs=env_kwargs, workflows=workflows)
            if roles is None or row["role"] in roles]
    if not rows:
        raise SystemExit(f"--roles {','.join(roles or ())}: no demonstration of these roles in workflows {','.join(workflows)}")
    data = os.path.join(work, "demos.parquet")
    pd.DataFrame(rows).to_parquet(data, index=False)
    print(f"{len(rows)} demonstrations ({episodes} episodes, p_correct={p_correct}) -> {data}", file=sys.stderr)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1",
               "-m", "verl.trainer.sft_trainer", *sft_overrides(data, base, work, steps, batch_size, lr, seed, lora_rank, lora_alpha)]
    print("+ " + " ".join(command), file=sys.stderr)
    if subprocess.run(command, cwd=work).returncode != 0:
        raise SystemExit(f"verl's SFT trainer failed (its output is above); the demonstrations are kept in {work}")
    staging = out.rstrip("/") + ".tmp"
    shutil.rmtree(staging, ignore_errors=True)
    checkpoint = step_folder(os.path.join(work, "checkpoints"), steps)
    if lora_rank:
        _export_adapter(checkpoint, os.path.join(work, "merged"), staging)
    else:
        _export_model(checkpoint, staging)
    with open(os.path.join(staging, "warm_start.json"), "w") as f:
        json.dump(record(base, rows, episodes=episodes, p_correct=p_correct, workflows=list(workflows), roles=list(roles or ()),
                         lora_rank=lora_rank, lora_alpha=lora_alpha if lora_rank else None, steps=steps, batch_size=batch_size,
                         lr=lr, seed=seed, env_kwargs=env_kwargs or {}), f, indent=1)
    os.replace(staging, out)
    shutil.rmtree(work)
    return out


def _export_model(checkpoint: str, staging: str) -> None:
    """The HF model verl's trainer saved with the checkpoint, copied to ``staging``."""
    exported = os.path.join(checkpoint, "huggingface")
    if not os.path.isfile(os.path.join(exported, "model.safetensors")):
        raise SystemExit(f"verl's SFT trainer ended without exporting a model to {exported}; its work folder is kept: "
                         f"{os.path.dirname(os.path.dirname(checkpoint))}")
    shutil.copytree(exported, staging)
    # verl's exporter writes the config from a bf16 copy; the weights are fp32, and an "auto" dtype load must say so
    config_path = os.path.join(staging, "config.json")
    config = json.load(open(config_path))
    config["dtype"] = "float32"
    with open(config_path, "w") as f:
        json.dump(config, f, indent=2)


def _export_adapter(checkpoint: str, merged: str, staging: str) -> None:
    """The LoRA adapter of a LoRA checkpoint, as a peft folder in ``staging``: verl's model_merger
    writes it (``<target>/lora_adapter``) beside the base model it merges."""
    command = [sys.executable, "-m", "verl.model_merger", "merge", "--backend", "fsdp", "--local_dir", checkpoint, "--target_dir", merged]
    print("+ " + " ".join(command), file=sys.stderr)
    adapter = os.path.join(merged, "lora_adapter")
    if subprocess.run(command).returncode != 0 or not os.path.isfile(os.path.join(adapter, "adapter_config.json")):
        raise SystemExit(f"verl's model_merger wrote no adapter to {adapter} (its output is above); the checkpoint is kept: {checkpoint}")
    shutil.copytree(adapter, staging)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", required=True, help="model folder to start from (e.g. the tiny model)")
    parser.add_argument("--out", required=True, help="folder to write the warm-started model to")
    parser.add_argument("--episodes", type=int, default=800, help="demonstration episodes (their workflows in turn: --workflows)")
    parser.add_argument("--p-correct", default="{}", help=f"chance of the right reply per kind as JSON (default {json.dumps(DEFAULT_P_CORRECT)})")
    parser.add_argument("--steps", type=int, default=1200, help="SFT optimizer steps")
    parser.add_argument("--batch-size", type=int, default=16, help="demonstrations per optimizer step")
    parser.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (cosine schedule)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the demonstrations and of verl's trainer")
    parser.add_argument("--workflows", default="sa,mas", help="the episodes' workflows, taken in turn (e.g. sa,mas,mas: two team episodes per single-agent "
                                                              "one)")
    parser.add_argument("--roles", default=None, help="comma-separated roles whose replies are trained on (default all), e.g. tool")
    parser.add_argument("--lora-rank", type=int, default=0, help="train a LoRA adapter of this rank on every linear layer and write the adapter (default 0: "
                                                                 "the whole model)")
    parser.add_argument("--lora-alpha", type=int, default=16, help="with --lora-rank: LoRA alpha (the update is scaled by alpha / rank)")
    parser.add_argument("--env-kwargs", default="{}", help='Plan-Path options as JSON, e.g. \'{"size": 5, "wall_density": 0.3}\'')
    args = parser.parse_args(argv)
    workflows = tuple(args.workflows.split(","))
    if not workflows or not set(workflows) <= {"sa", "mas"}:
        parser.error(f"--workflows {args.workflows}: a comma-separated list of sa and mas, e.g. sa,mas")
    roles = tuple(args.roles.split(",")) if args.roles else None
    if roles and not set(roles) <= {"tool", "plan"}:
        parser.error(f"--roles {args.roles}: a comma-separated list of tool and plan")
    if args.lora_rank < 0:
        parser.error(f"--lora-rank {args.lora_rank}: 0 (the whole model) or more")
    warm_start(args.base, args.out, args.episodes, json.loads(args.p_correct), args.steps, args.batch_size, args.lr, args.seed,
               json.loads(args.env_kwargs), workflows, roles, args.lora_rank, args.lora_alpha)
    print(f"warm-started model written to {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
