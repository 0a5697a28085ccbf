#!/usr/bin/env bash
# What needs a CUDA device, in one go (a lent GPU machine's time is short): the rollout benchmark on
# CUDA, the `gpu`-marked tests (engine fp32/bf16, replica sleep/wake, the quickstart on one GPU in
# fp32 and bf16), and one training step of each policy mode (L0 shared, L1 LoRA per role, L2 full
# model per role) on Plan-Path through `python -m verl.trainer.main_ppo`. Each part has its own time
# limit and log in OUT_DIR; a failed part does not stop the rest; the summary goes to stdout. A
# main_ppo run spends ~80 s starting (Ray, workers, replicas) before its first step, so the tests (four
# xdist workers) and the three modes run side by side (16 cores, one GPU with room for all); the
# benchmark runs first, alone.
#
# Everything here uses the `hf` rollout: vLLM cannot be brought to such a machine (no package index,
# and its wheel alone is larger than what travels). The vLLM path runs on CPU in the vLLM tier
# (`make test-vllm`); what only a GPU would show stays unchecked: sleep mode (levels 1 and 2),
# tensor parallelism, gpu_memory_utilization, CUDA IPC weight transfer, CUDA graphs (docs/gpus.md).
#
#   bash benchmarks/gpu_checks.sh OUT_DIR     (python3 must import torch with CUDA, verl and pettingllms_verl)
set -u
out=${1:?usage: bash benchmarks/gpu_checks.sh OUT_DIR}
repo=$(cd "$(dirname "$0")/.." && pwd)
metrics=/tmp/gpu_checks_metrics  # the modes' step metrics: the summary prints them
rm -rf "$metrics" /tmp/gpu_checks_pytest  # a reused machine's earlier runs would be summarised too
mkdir -p "$out" "$metrics"
export PETTINGLLMS_ARTIFACTS=${PETTINGLLMS_ARTIFACTS:-/tmp/gpu_checks_artifacts} PYTHONUNBUFFERED=1
cd "$repo"

part() {  # name seconds command...: run with a limit, log to OUT_DIR/name.log, print rc and wall time
  local name=$1 limit=$2 start=$SECONDS
  shift 2
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  echo "== $name: rc=$? in $((SECONDS - start)) s"
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, transformers, verl; print('torch', torch.__version__, 'cuda', torch.version.cuda, '| transformers', transformers.__version__, '| verl', verl.__version__)" 2>/dev/null

part bench_rollout 90 python3 benchmarks/bench_rollout.py --device cuda --out "$out/rollout.json"
grep '^|' "$out/bench_rollout.log"

python3 data_prep/plan_path.py --size 6 --train 256 --val 16 --test 32 --out-dir "$PETTINGLLMS_ARTIFACTS/data/plan_path_6x6" >/dev/null
python3 -m pettingllms_verl.models.tiny --out "$PETTINGLLMS_ARTIFACTS/tiny_model_plan_path" >/dev/null 2>&1  # untrained: a smoke step
for mode in L0:plan_path_mas_atgrpo_cpu L1:plan_path_mas_lora_cpu L2:plan_path_mas_full_cpu; do
  VERL_FILE_LOGGER_PATH="$metrics/${mode%%:*}.jsonl" part "${mode%%:*}" 270 python3 -m verl.trainer.main_ppo \
    --config-path "$repo/recipes" --config-name "${mode#*:}" trainer.device=cuda trainer.total_training_steps=1 \
    trainer.val_before_train=false trainer.test_freq=-1 trainer.save_freq=-1 &
done
# the two quickstart runs (2-4 min each) get their own workers: queued behind each other they outran the limit
gpu_tests=(python3 -m pytest -q -n 2 -m gpu -p no:cacheprovider --continue-on-collection-errors)
part test_gpu_quickstart 420 "${gpu_tests[@]}" --basetemp=/tmp/gpu_checks_pytest/quickstart tests/e2e/test_quickstart_e2e.py &
part test_gpu 420 "${gpu_tests[@]}" --basetemp=/tmp/gpu_checks_pytest/rest --ignore=tests/e2e/test_quickstart_e2e.py tests
wait
for log in test_gpu test_gpu_quickstart; do grep -E "passed|failed|FAILED|ERROR" "$out/$log.log" | tail -n 8; done
# per step: the quickstart test's runs (verl's file logger under the test's tmp dir, run_<precision>.jsonl), then each mode's
python3 - "$metrics" <<'EOF'
import glob, json, os, sys
# pytest's "<name>current" links repeat the numbered folders: real paths, each once
runs = sorted({os.path.realpath(p) for p in glob.glob("/tmp/gpu_checks_pytest/**/run_*.jsonl", recursive=True)})
runs += sorted(glob.glob(sys.argv[1] + "/L*.jsonl"))
keys = ("timing_s/step", "timing_s/gen", "training/rollout_probs_diff_mean", "mas/success")
for path in runs:
    name = os.path.basename(path)
    for record in map(json.loads, open(path)):
        data = record["data"]
        print(name, "step", record["step"], {k: round(v, 6) for k, v in sorted(data.items()) if k.startswith(keys) or k.endswith("grad_norm")})
EOF
