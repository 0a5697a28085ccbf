#!/usr/bin/env bash
# Plan-Path 6x6 on CPU: tool + plan agents with AT-GRPO tree sampling (pass
# --config-name plan_path_sa_grpo_cpu for the single-agent GRPO baseline). Repository root, venv active.
set -euo pipefail
export PETTINGLLMS_ARTIFACTS=${PETTINGLLMS_ARTIFACTS:-$PWD/artifacts} HF_HUB_OFFLINE=1
[ -f "$PETTINGLLMS_ARTIFACTS/tiny_model_plan_path/config.json" ] || \
  python -m pettingllms_verl.models.tiny --out "$PETTINGLLMS_ARTIFACTS/tiny_model_plan_path" --warm-start plan_path
[ -f "$PETTINGLLMS_ARTIFACTS/data/plan_path_6x6/val.parquet" ] || \
  python data_prep/plan_path.py --size 6 --train 256 --val 16 --test 32 --out-dir "$PETTINGLLMS_ARTIFACTS/data/plan_path_6x6"
python -m verl.trainer.main_ppo --config-path "$PWD/recipes" --config-name plan_path_mas_atgrpo_cpu "$@"
