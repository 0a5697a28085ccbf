#!/usr/bin/env bash
# The CPU quickstart: `make quickstart` (the Makefile is the one place that builds the tiny model and
# data, where missing, and launches; it prints the launch command it runs). Arguments are Hydra
# overrides (no spaces inside one), e.g. examples/cpu_quickstart.sh trainer.save_freq=-1; PY=python
# uses the active Python instead of the Makefile's .venv.
set -euo pipefail
exec make -C "$(dirname "$0")/.." quickstart ${PY:+PY="$PY"} ARGS="$*"
