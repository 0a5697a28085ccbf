#!/usr/bin/env bash
# An archive of everything an offline CUDA machine lacks to run gpu_checks.sh: its python has torch
# (and a known list of other packages) but no package index. The project's pinned closure is
# resolved for the target's Python on manylinux x86-64 against a stub torch (the target's own torch
# stays), the packages the target already has are dropped (transformers, tokenizers and peft are
# kept: their pins matter), and the rest is installed into one folder and xz-compressed. On the
# target: tar -C /tmp -xJf ARCHIVE; export PYTHONPATH=/tmp/site<ver>:$PWD; pip install --no-deps
# --no-index --no-build-isolation -e .   (the editable install registers the verl plugin entry point).
#
#   bash benchmarks/offline_wheels.sh HAVE_FILE OUT.tar.xz [PYTHON_VERSION=3.12] [TORCH_VERSION=2.11.0]
# HAVE_FILE: package names already on the target, whitespace-separated (its `pip list` first column).
set -euo pipefail
have=${1:?usage: bash benchmarks/offline_wheels.sh HAVE_FILE OUT.tar.xz [PYTHON_VERSION] [TORCH_VERSION]}
out=${2:?usage: bash benchmarks/offline_wheels.sh HAVE_FILE OUT.tar.xz [PYTHON_VERSION] [TORCH_VERSION]}
py=${3:-3.12} torch=${4:-2.11.0}
repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
site=$work/site${py//./}
platform=(--only-binary=:all: --python-version "$py" --implementation cp)
for tag in manylinux_2_28 manylinux_2_27 manylinux_2_17 manylinux2014 manylinux1; do platform+=(--platform "${tag}_x86_64"); done
export PIP_CONSTRAINT=  # a machine-wide pip constraint (a torch cap) must not steer the target's resolution

# A stub torch wheel of the target's version with no requirements, so the resolution keeps it out.
mkdir -p "$work/stub/torch-$torch.dist-info"
printf 'Metadata-Version: 2.1\nName: torch\nVersion: %s\n' "$torch" >"$work/stub/torch-$torch.dist-info/METADATA"
printf 'Wheel-Version: 1.0\nGenerator: stub\nRoot-Is-Purelib: true\nTag: py3-none-any\n' >"$work/stub/torch-$torch.dist-info/WHEEL"
: >"$work/stub/torch-$torch.dist-info/RECORD"
(cd "$work/stub" && python3 -m zipfile -c "torch-$torch-py3-none-any.whl" "torch-$torch.dist-info")
# hydra-core needs antlr4 4.9.*, published as an sdist only: build its (pure-Python) wheel here.
python3 -m pip wheel -q --no-deps antlr4-python3-runtime==4.9.3 -w "$work/stub"
antlr=$(ls "$work"/stub/antlr4*.whl)

grep -v -e '^torch==' -e '^#' "$repo/constraints.txt" >"$work/constraints.txt"
deps=$(python3 -c "import tomllib, sys; p = tomllib.load(open(sys.argv[1], 'rb'))['project']; print(' '.join(p['dependencies'] + p['optional-dependencies']['test']))" "$repo/pyproject.toml")
# shellcheck disable=SC2086  # deps: one word per requirement
python3 -m pip install -q --dry-run --ignore-installed --report "$work/report.json" --target "$work/dry" "${platform[@]}" \
  -c "$work/constraints.txt" "torch @ file://$work/stub/torch-$torch-py3-none-any.whl" "antlr4-python3-runtime @ file://$antlr" $deps
python3 - "$work/report.json" "$have" >"$work/carry.txt" <<'PY'
import json, re, sys
norm = lambda name: re.sub(r"[-_.]+", "-", name).lower()
have = {norm(name) for name in open(sys.argv[2]).read().split()} - {"transformers", "tokenizers", "peft"}
for item in json.load(open(sys.argv[1]))["install"]:
    name, version = item["metadata"]["name"], item["metadata"]["version"]
    if norm(name) not in have | {"torch", "wandb", "antlr4-python3-runtime"}:  # wandb: optional and large
        print(f"{name}=={version}")
PY
echo "carrying $(wc -l <"$work/carry.txt") packages"
python3 -m pip install -q --no-deps --target "$site" "${platform[@]}" -r "$work/carry.txt" "$antlr"
# Ray's Java jars and dashboard front end are not used and are a fifth of the archive.
rm -rf "$site/ray/jars" "$site/ray/dashboard/client"
find "$site" -name __pycache__ -type d -prune -exec rm -rf {} +
tar -C "$work" -cf - "$(basename "$site")" | xz -T0 -6 >"$out"
rm -rf "$work"
echo "wrote $out ($(du -h "$out" | cut -f1)); on the target: tar -C /tmp -xJf $(basename "$out")"
