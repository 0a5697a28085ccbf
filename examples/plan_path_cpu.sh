#!/usr/bin/env bash
# Plan-Path 6x6 on CPU: tool + plan agents with AT-GRPO tree sampling, `make plan-path` (builds the
# warm-started tiny model and the data where missing, then launches). RECIPE=plan_path_sa_grpo_cpu
# in the environment runs the single-agent GRPO baseline; arguments are Hydra overrides (no spaces
# inside one); PY=python uses the active Python instead of the Makefile's .venv.
set -euo pipefail
exec make -C "$(dirname "$0")/.." plan-path ${RECIPE:+RECIPE="$RECIPE"} ${PY:+PY="$PY"} ARGS="$*"
