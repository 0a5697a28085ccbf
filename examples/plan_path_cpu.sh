#!/usr/bin/env bash
# Plan-Path 6x6 on CPU: tool + plan agents with AT-GRPO tree sampling, `make plan-path` (builds the
# warm-started tiny model and the data where missing, then launches). RECIPE=plan_path_sa_grpo_cpu
# in the environment runs the single-agent GRPO baseline; arguments are Hydra overrides.
set -euo pipefail
exec make -C "$(dirname "$0")/.." plan-path ${RECIPE:+RECIPE="$RECIPE"} ARGS="$*"
