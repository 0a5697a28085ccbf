#!/usr/bin/env bash
# The CPU quickstart: `make quickstart` (the Makefile is the one place that builds the tiny model and
# data, where missing, and launches; it prints the launch command it runs). Arguments are Hydra
# overrides, e.g. examples/cpu_quickstart.sh trainer.save_freq=-1
set -euo pipefail
exec make -C "$(dirname "$0")/.." quickstart ARGS="$*"
