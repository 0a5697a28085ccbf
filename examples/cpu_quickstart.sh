#!/usr/bin/env bash
# The CPU quickstart by hand (what `make quickstart` does), from the repository root, venv active.
set -euo pipefail
export PETTINGLLMS_ARTIFACTS=${PETTINGLLMS_ARTIFACTS:-$PWD/artifacts} HF_HUB_OFFLINE=1
[ -f "$PETTINGLLMS_ARTIFACTS/tiny_model/config.json" ] || python -m pettingllms_verl.models.tiny --out "$PETTINGLLMS_ARTIFACTS/tiny_model"
[ -f "$PETTINGLLMS_ARTIFACTS/data/quickstart/train.parquet" ] || python data_prep/quickstart.py --out-dir "$PETTINGLLMS_ARTIFACTS/data/quickstart"
python -m verl.trainer.main_ppo --config-path "$PWD/recipes" --config-name quickstart_cpu "$@"
