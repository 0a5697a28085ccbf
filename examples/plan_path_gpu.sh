#!/usr/bin/env bash
# Plan-Path 10x10 with Qwen3-1.7B on one 8-GPU node (vLLM rollout), AT-GRPO with the reference
# hyperparameters: `make run RECIPE=plan_path_mas_atgrpo_qwen3_1p7b` (builds the data where missing,
# then launches). Needs the hub (or actor_rollout_ref.model.path=<local dir> as an argument) and a
# Python with CUDA torch and vLLM (pip install -e ".[vllm]" in a fresh environment, README "On a GPU"):
# the active python3, or PY=<python>; never the Makefile's CPU .venv, which has no vLLM.
# Arguments are Hydra overrides. Not yet run on a GPU (docs/gpus.md).
set -euo pipefail
exec make -C "$(dirname "$0")/.." run RECIPE=plan_path_mas_atgrpo_qwen3_1p7b HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-0}" \
  PY="${PY:-python3}" ARGS="$*"
