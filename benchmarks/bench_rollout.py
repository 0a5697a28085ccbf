"""Rollout throughput of the hf replica, and the quickstart's steady-state step time.

1. Tokens/s on the tiny model for N concurrent requests: batched (one generate per batch, as the
   server does) vs one request at a time. Greedy-free sampling at temperature 1 with eos disabled
   by a fixed token budget, so both modes generate the same number of tokens.
2. Shared prefill work: K requests with one identical prompt (the K branches of an AT-GRPO tree
   node), and N requests whose prompts share a long common prefix (N episodes of one role: the
   same system prompt and rules, then their own state), with the shared part prefilled once vs
   every prompt prefilled whole, on the tiny model and on a random ~100M-parameter one
   (bench_policies.py's).
   With --vllm (in .venv-vllm: vLLM's CPU build), vLLM's engine on the same models and requests
   (prefix caching on, its cache emptied before each try), both engines on one core.
3. (--step-metrics [LABEL=]FILE, repeatable) mean per-phase times of a run from verl's file logger,
   skipping the run's first step (lazy worker start-up): e.g. the L0 recipe with each engine.

    python benchmarks/bench_rollout.py [--requests 8] [--tokens 32] [--device cpu|cuda] [--k 4] [--prompt-tokens 256]
        [--episodes 16] [--common-tokens 200] [--vllm] [--step-metrics [LABEL=]run.jsonl ...]
"""

import argparse
import json
import os
import sys
import tempfile
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from bench_policies import MODEL_100M
from pettingllms_verl.backends.hf.engine import HFGenerationEngine, SamplingSpec
from pettingllms_verl.models.tiny import build

STEP_PHASES = ("timing_s/gen", "timing_s/old_log_prob", "timing_s/update_actor", "timing_s/update_weights", "timing_s/step")


def rollout_rates(requests: int, tokens: int, device: str = "cpu", repeats: int = 3) -> dict:
    model_dir = build(tempfile.mkdtemp(prefix="bench_tiny_"), seed=0)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa").to(device)
    engine = HFGenerationEngine(model, tokenizer)
    engine.eos_token_ids = [len(tokenizer) + 1]  # an id never sampled: fixed-length replies, equal work in both modes
    prompts = [
        tokenizer.apply_chat_template([{"role": "user", "content": f"request {i}: 3 1 4 1 5"}], add_generation_prompt=True, tokenize=True, return_dict=False)
        for i in range(requests)
    ]
    spec = SamplingSpec(max_tokens=tokens, temperature=1.0)

    def best_rate(fn) -> float:
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            generated = fn()
            best = min(best, time.perf_counter() - start)
        return generated / best

    batched = best_rate(lambda: sum(len(o.token_ids) for o in engine.generate(prompts, [spec] * requests)))
    serial = best_rate(lambda: sum(len(engine.generate([p], [spec])[0].token_ids) for p in prompts))
    return {"device": device, "requests": requests, "tokens_per_request": tokens, "batched_tokens_per_s": batched,
            "one_at_a_time_tokens_per_s": serial, "speedup": batched / serial}


def vllm_engine(model_dir: str):
    """vLLM's offline engine on ``model_dir`` as the rollout runs it on CPU (recipes/base/cpu_vllm.yaml):
    fp32, eager, prefix caching; in this process, on one core."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0")
    from vllm import LLM

    return LLM(model=model_dir, dtype="float32", enforce_eager=True, enable_prefix_caching=True,
               max_num_batched_tokens=1024, max_num_seqs=32, seed=0)


def vllm_seconds(llm, prompts: list[list[int]], tokens: int, repeats: int) -> float:
    """Best wall time of one ``generate`` on ``prompts``, each reply ``tokens`` long, from an empty prefix cache."""
    from vllm import SamplingParams, TokensPrompt

    params = SamplingParams(max_tokens=tokens, temperature=1.0, ignore_eos=True)
    best = float("inf")
    for _ in range(repeats):
        llm.reset_prefix_cache()
        start = time.perf_counter()
        llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        best = min(best, time.perf_counter() - start)
    return best


def shared_prompt_times(
    k: int, prompt_tokens: int, tokens: int, episodes: int, common_tokens: int, device: str = "cpu", repeats: int = 3,
    with_vllm: bool = False,
) -> list[dict]:
    """Seconds for K requests on one prompt, and for ``episodes`` prompts of ``prompt_tokens`` that
    share their first ``common_tokens``: shared prefill vs every prompt whole (best of ``repeats``),
    and vLLM's engine on the same requests where ``with_vllm``."""
    rows = []
    for name, shape in (("tiny", {}), ("100m", MODEL_100M)):
        model_dir = build(tempfile.mkdtemp(prefix=f"bench_{name}_"), seed=0, **shape)
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa").to(device)
        engine = HFGenerationEngine(model, tokenizer)
        engine.eos_token_ids = [len(tokenizer) + 1]  # fixed-length replies: equal work in both modes
        generator = torch.Generator().manual_seed(0)
        prompt = torch.randint(4, len(tokenizer), (prompt_tokens,), generator=generator).tolist()
        tails = torch.randint(4, len(tokenizer), (episodes, prompt_tokens - common_tokens), generator=generator).tolist()
        cases = {f"{k} branches, one prompt": [prompt] * k, f"{episodes} episodes, {common_tokens} common tokens": [prompt[:common_tokens] + t for t in tails]}
        spec = SamplingSpec(max_tokens=tokens, temperature=1.0)
        llm = vllm_engine(model_dir) if with_vllm else None
        for case, prompts in cases.items():
            times = {}
            for shared in (True, False):
                engine.share_prefill = shared
                best = float("inf")
                for _ in range(repeats):
                    start = time.perf_counter()
                    engine.generate(prompts, [spec] * len(prompts))
                    best = min(best, time.perf_counter() - start)
                times[shared] = best
            rows.append({"model": name, "case": case, "requests": len(prompts), "prompt_tokens": prompt_tokens, "tokens_per_request": tokens,
                         "shared_s": times[True], "per_request_s": times[False], "speedup": times[False] / times[True]}
                        | ({"vllm_s": vllm_seconds(llm, prompts, tokens, repeats)} if llm is not None else {}))
        del llm
    return rows


def step_breakdown(metrics_path: str) -> dict:
    records = [json.loads(line) for line in open(metrics_path)]
    steady = [r["data"] for r in records[1:]] or [r["data"] for r in records]
    return {phase: sum(d[phase] for d in steady) / len(steady) for phase in STEP_PHASES if phase in steady[0]} | {
        "steps_averaged": len(steady)
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=8, help="concurrent requests")
    parser.add_argument("--tokens", type=int, default=32, help="tokens generated per request")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="where the engine runs")
    parser.add_argument("--k", type=int, default=4, help="requests sharing one prompt (branches of a tree node)")
    parser.add_argument("--prompt-tokens", type=int, default=256, help="prompt length")
    parser.add_argument("--episodes", type=int, default=16, help="requests with a common prefix (episodes of one role)")
    parser.add_argument("--common-tokens", type=int, default=200, help="their common prefix (Plan-Path's tool prompt: ~206 of ~258)")
    parser.add_argument("--vllm", action="store_true", help="also time vLLM's engine on the shared-prompt requests (needs vLLM: .venv-vllm)")
    parser.add_argument("--step-metrics", action="append", default=[], metavar="[LABEL=]FILE",
                        help="verl file-logger jsonl of a run (repeatable; the label defaults to the file's name)")
    parser.add_argument("--out", default="benchmarks/results/rollout.json", help="JSON output path")
    args = parser.parse_args(argv)
    if args.device == "cpu":
        torch.set_num_threads(1)  # as the hf server does on CPU (see pettingllms_verl/backends/hf/rollout.py)
    result = {"rollout": rollout_rates(args.requests, args.tokens, args.device)}
    r = result["rollout"]
    print(f"| hf rollout on {r['device']}, {r['requests']} requests x {r['tokens_per_request']} tokens | tokens/s |")
    print("|---|---|")
    print(f"| batched (one generate call) | {r['batched_tokens_per_s']:.0f} |")
    print(f"| one at a time | {r['one_at_a_time_tokens_per_s']:.0f} |")
    print(f"| speed-up | {r['speedup']:.1f}x |")
    result["shared_prompt"] = shared_prompt_times(args.k, args.prompt_tokens, args.tokens, args.episodes, args.common_tokens, args.device,
                                                  with_vllm=args.vllm)
    vllm_head = " vLLM (s) | vLLM tokens/s | hf shared tokens/s |" if args.vllm else ""
    print(f"\n| {args.prompt_tokens}-token prompts, {args.tokens} tokens each | model | hf shared prefill (s) | hf every prompt whole (s) | speed-up "
          f"|{vllm_head}")
    print("|---|---|---|---|---|" + ("---|---|---|" if args.vllm else ""))
    for row in result["shared_prompt"]:
        generated = row["requests"] * row["tokens_per_request"]
        vllm_cells = f" {row['vllm_s']:.3f} | {generated / row['vllm_s']:.0f} | {generated / row['shared_s']:.0f} |" if args.vllm else ""
        print(f"| {row['case']} | {row['model']} | {row['shared_s']:.3f} | {row['per_request_s']:.3f} | {row['speedup']:.2f}x |{vllm_cells}")
    runs = dict(item.split("=", 1) if "=" in item else (os.path.basename(item), item) for item in args.step_metrics)
    if runs:
        result["step_s"] = {label: step_breakdown(path) for label, path in runs.items()}
        print("\n| steady-state phase (s) | " + " | ".join(runs) + " |\n|---|" + "---|" * len(runs))
        for phase in (*STEP_PHASES, "steps_averaged"):
            print(f"| {phase} | " + " | ".join(f"{result['step_s'][label].get(phase, float('nan')):.3g}" for label in runs) + " |")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(f"\nwrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
