#!/usr/bin/env bash
# Plan-Path 10x10 with Qwen3-1.7B on one 8-GPU node (vLLM rollout), AT-GRPO with the reference
# hyperparameters. Needs the hub (or actor_rollout_ref.model.path=<local dir>). Not yet run by us.
set -euo pipefail
export PETTINGLLMS_ARTIFACTS=${PETTINGLLMS_ARTIFACTS:-$PWD/artifacts}
[ -f "$PETTINGLLMS_ARTIFACTS/data/plan_path_10x10/val.parquet" ] || \
  python data_prep/plan_path.py --size 10 --out-dir "$PETTINGLLMS_ARTIFACTS/data/plan_path_10x10"
python -m verl.trainer.main_ppo --config-path "$PWD/recipes" --config-name plan_path_mas_atgrpo_qwen3_1p7b "$@"
