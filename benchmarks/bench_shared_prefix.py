"""Shared prompts processed once: tokens and time of prefill, old log-probs and one update,
plain vs shared, in verl's own FSDP2 engine (``trainer/shared_prefix.py``) and the hf rollout.

For K in {1, 4, 8} and prompt/reply lengths like the environments' (Plan-Path: ~260-token prompts,
~36-token replies; a long multi-turn case), a batch of G groups of K replies to one prompt each:

- prefill: the hf engine generating 1 token for each of the K requests of a group (one prefill
  shared vs one per request);
- old log-probs: ``forward_backward_batch(forward_only=True)``;
- update: ``forward_backward_batch`` with a loss + ``optimizer_step``;

each best of ``--repeats``, on the tiny model and on SmolLM2-135M-Instruct when converted
(``make real-model``). Prints a table and writes JSON.

    python benchmarks/bench_shared_prefix.py [--models tiny,smollm2] [--groups 2] [--repeats 2] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))  # tests/support: verl's engine in this process

CASES = (  # (name, prompt tokens, reply tokens)
    ("plan_path", 260, 36),
    ("multi_turn", 900, 60),
)
KS = (1, 4, 8)


def _loss(model_output, data, dp_group=None):
    from verl.workers.utils.padding import no_padding_2_padding

    return -(no_padding_2_padding(model_output["log_probs"], data) * data["response_mask"]).sum() / 1000, {}


def _best(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def engine_rows(model_name: str, model_path: str, groups: int, repeats: int) -> list[dict]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pettingllms_verl.backends.hf.engine import HFGenerationEngine, SamplingSpec
    from support.local_engine import local_engine, no_padding_batch
    from pettingllms_verl.trainer.shared_prefix import SharedPrefixFSDPEngine

    engine = local_engine(model_path, engine_cls=SharedPrefixFSDPEngine)
    vocab = engine.module.config.vocab_size
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32, attn_implementation="sdpa")
    rollout = HFGenerationEngine(model, tokenizer)
    rollout.eos_token_ids = [vocab + 1]
    rows = []
    for case, prompt_len, reply_len in CASES:
        for k in KS:
            g = torch.Generator().manual_seed(k)
            tok = lambda n: torch.randint(3, vocab, (n,), generator=g).tolist()  # noqa: E731
            prompts, replies = [], []
            for _ in range(groups):
                prompt = tok(prompt_len)
                for _ in range(k):
                    prompts.append(prompt)
                    replies.append(tok(reply_len - int(torch.randint(0, reply_len // 3, (1,), generator=g))))
            meta = dict(use_dynamic_bsz=False, micro_batch_size_per_gpu=k, calculate_entropy=False)
            row = {"model": model_name, "case": case, "k": k, "groups": groups, "prompt_tokens": prompt_len, "reply_tokens": reply_len}
            for share in (False, True):
                name = "shared" if share else "plain"
                engine.share_prefix = share
                out = {}

                def old_log_probs():
                    with torch.no_grad():
                        out["o"] = engine.forward_backward_batch(no_padding_batch(prompts, replies, **meta), loss_function=None, forward_only=True)

                def update():
                    engine.optimizer_zero_grad()
                    out["u"] = engine.forward_backward_batch(no_padding_batch(prompts, replies, **meta), loss_function=_loss)
                    engine.optimizer_step()

                def prefill():
                    rollout.share_prefill = share
                    for i in range(groups):
                        rollout.generate([prompts[i * k]] * k, [SamplingSpec(max_tokens=1, temperature=1.0)] * k)

                with engine.eval_mode():
                    row[f"old_log_prob_{name}_s"] = _best(old_log_probs, repeats)
                with engine.train_mode():
                    row[f"update_{name}_s"] = _best(update, repeats)
                row[f"prefill_{name}_s"] = _best(prefill, repeats)
                plain_tokens = sum(len(p) + len(r) for p, r in zip(prompts, replies, strict=True))
                frac = out["o"]["metrics"].get("shared_prefix/token_frac", [1.0])[0] if share else 1.0
                row[f"tokens_{name}"] = round(plain_tokens * frac)
            for phase in ("prefill", "old_log_prob", "update"):
                row[f"{phase}_speedup"] = row[f"{phase}_plain_s"] / row[f"{phase}_shared_s"]
            rows.append(row)
            print(_format(row), flush=True)
    return rows


HEADER = ("| model | case (prompt/reply tokens) | K | tokens plain → shared | prefill plain / shared (s) | old log-probs plain / shared (s) "
          "| update plain / shared (s) | speed-up prefill / old lp / update |\n|---|---|---|---|---|---|---|---|")


def _format(r: dict) -> str:
    return (f"| {r['model']} | {r['case']} ({r['prompt_tokens']}/{r['reply_tokens']}) | {r['k']} | {r['tokens_plain']} → {r['tokens_shared']} "
            f"| {r['prefill_plain_s']:.3f} / {r['prefill_shared_s']:.3f} | {r['old_log_prob_plain_s']:.3f} / {r['old_log_prob_shared_s']:.3f} "
            f"| {r['update_plain_s']:.3f} / {r['update_shared_s']:.3f} | {r['prefill_speedup']:.2f}x / {r['old_log_prob_speedup']:.2f}x / "
            f"{r['update_speedup']:.2f}x |")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="tiny,smollm2", help="comma-separated: tiny, smollm2 (skipped with a note when not converted)")
    parser.add_argument("--groups", type=int, default=2, help="groups (distinct prompts) per batch")
    parser.add_argument("--repeats", type=int, default=2, help="best of this many runs per measurement")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "shared_prefix.json"))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    from pettingllms_verl.registration import register

    register()  # the CPU platform, before verl resolves its device
    from pettingllms_verl.models import smollm2
    from pettingllms_verl.models.tiny import build

    paths = {}
    for name in args.models.split(","):
        if name == "tiny":
            paths[name] = build(tempfile.mkdtemp(prefix="bench_tiny_"), seed=0)
        elif name == "smollm2":
            path = os.path.join(smollm2.artifacts_dir(), smollm2.FOLDER)
            if not os.path.isfile(os.path.join(path, "config.json")):
                print(f"note: {path} not found (make real-model): SmolLM2 rows skipped", flush=True)
                continue
            paths[name] = path
        else:
            parser.error(f"--models: unknown model {name!r} (tiny, smollm2)")
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs, torch threads {args.threads}\n")
    print(HEADER, flush=True)
    rows = [row for name, path in paths.items() for row in engine_rows(name, path, args.groups, args.repeats)]
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"load_average": os.getloadavg()[0], "rows": rows}, f, indent=1)
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    sys.exit(main())
