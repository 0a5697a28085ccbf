"""The GPU extra (``pip install "pettingllms-verl[vllm]"``) resolves together with verl's pins:
verl 0.9.1's own ``vllm`` extra pins torch, vLLM and transformers, and this package's declared
ranges must admit those pins (checked offline from the installed verl's metadata), and pip's
resolver must find one consistent set for the whole extra (checked where an index answers)."""

import json
import subprocess
import sys
import tomllib
from importlib.metadata import requires
from pathlib import Path

import pytest
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]


def _declared() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def _verl_vllm_pins() -> dict[str, Requirement]:
    pins = {}
    for text in requires("verl") or []:
        requirement = Requirement(text)
        if requirement.marker is not None and requirement.marker.evaluate({"extra": "vllm"}) and requirement.specifier:
            pins[requirement.name.lower()] = requirement
    return pins


def test_our_ranges_admit_every_pin_of_verls_vllm_extra():
    assert _declared()["optional-dependencies"]["vllm"] == ["verl[vllm]>=0.9.1,<0.10"]
    pins = _verl_vllm_pins()
    assert {"vllm", "torch", "transformers"} <= set(pins)
    checked = 0
    for text in _declared()["dependencies"]:
        ours = Requirement(text)
        pin = pins.get(ours.name.lower())
        if pin is None:
            continue
        (exact,) = [spec.version for spec in pin.specifier if spec.operator == "=="]
        assert ours.specifier.contains(exact), f"{ours} excludes verl[vllm]'s {pin}"
        checked += 1
    assert checked >= 1  # transformers at least


@pytest.mark.slow
def test_pip_resolves_the_gpu_extra(tmp_path):
    report = tmp_path / "report.json"
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--no-build-isolation", "-q", "--report", str(report),
         f"{REPO}[vllm]"],
        capture_output=True, text=True, timeout=900,
    )
    unreachable = ("No matching distribution found", "Could not find a version that satisfies", "NewConnectionError",
                   "Network is unreachable", "Temporary failure in name resolution")
    if result.returncode != 0 and "ResolutionImpossible" not in result.stderr and any(text in result.stderr for text in unreachable):
        pytest.skip(f"no package index with vLLM reachable here: {result.stderr.strip().splitlines()[-1]}")
    assert result.returncode == 0, result.stderr[-3000:]  # e.g. ResolutionImpossible: the ranges disagree
    versions = {item["metadata"]["name"].lower(): item["metadata"]["version"] for item in json.loads(report.read_text())["install"]}
    pins = _verl_vllm_pins()
    for name in ("vllm", "torch", "transformers"):
        assert pins[name].specifier.contains(versions[name]), (name, versions[name], str(pins[name]))
    assert versions["pettingllms-verl"] and versions["verl"].startswith("0.9.")


def test_make_test_gpu_fails_where_torch_sees_no_cuda_device_rather_than_skipping_every_test():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible here: make test-gpu would run the GPU tests")
    # -o: the installed environment is taken as it is (this interpreter's), never reinstalled by the test
    result = subprocess.run(["make", "-o", str(REPO / ".venv" / ".installed"), "test-gpu", f"PY={sys.executable}"],
                            cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert f"make test-gpu: torch {torch.__version__} sees no CUDA device" in result.stderr
    assert "make install TORCH_INDEX=https://download.pytorch.org/whl/cu128" in result.stderr
    assert "passed" not in result.stdout  # no pytest ran


def test_make_install_with_another_torch_index_replaces_torch_and_with_the_same_one_does_nothing(tmp_path):
    """A stand-in interpreter records what make asks of pip."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text('#!/bin/sh\necho "PY $@"\n')
    (venv / "bin" / "python").chmod(0o755)
    cpu, cuda = "https://download.pytorch.org/whl/cpu", "https://download.pytorch.org/whl/cu128"

    def install(index: str) -> list[str]:
        result = subprocess.run(["make", "install", f"VENV={venv}", f"TORCH_INDEX={index}", "TORCH_INDEX_REACHABLE=yes"],
                                cwd=REPO, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        return [line for line in result.stdout.splitlines() if line.startswith("PY ") and " torch" in line]

    (torch_line,) = install(cpu)  # a new environment
    assert f"--extra-index-url {cpu}" in torch_line
    assert install(cpu) == []  # installed from that index already: nothing to do
    (torch_line,) = install(cuda)  # another index on the same environment: torch replaced from it
    assert f"--extra-index-url {cuda}" in torch_line and torch_line.endswith("--force-reinstall")
    assert install(cuda) == []
