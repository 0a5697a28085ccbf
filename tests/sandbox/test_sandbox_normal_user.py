"""The sandbox as a normal user (uid 65534, no capabilities), run from this root test process
through ``tests/support/normal_user.py``: its whole test file and the code environment's hostile
programs pass there too, and where the kernel also refuses user namespaces it refuses to run
code unless the user opts in."""

import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

import pytest

from pettingllms_verl.sandbox.client import ALLOW_UNISOLATED_ENV

from support import REPO, SUPPORT

HELPER = str(SUPPORT / "normal_user.py")

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="needs root to switch to a normal user; as a normal user the other sandbox tests already run this way"
)


@pytest.fixture()
def tmp_path():
    """A temporary directory a normal user can reach (pytest's own sits under a 0700 directory)."""
    path = tempfile.mkdtemp(prefix="pettingllms-normal-user-")
    os.chmod(path, 0o755)
    yield pathlib.Path(path)
    shutil.rmtree(path, ignore_errors=True)


def _as_normal_user(workdir, *command: str, no_user_namespaces: bool = False, env: dict | None = None):
    home = workdir / "home"
    home.mkdir(parents=True)
    os.chmod(workdir, 0o755)
    os.chmod(home, 0o777)
    variables = {"HOME": str(home), "PYTHONDONTWRITEBYTECODE": "1", "PATH": "/usr/bin:/bin", **(env or {})}
    flags = ["--no-user-namespaces"] if no_user_namespaces else []
    argv = [sys.executable, HELPER, *flags, "--", "env", "-i", *(f"{k}={v}" for k, v in variables.items()), *command]
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=600)


def test_sandbox_and_hostile_program_tests_pass_as_a_normal_user(tmp_path):
    result = _as_normal_user(
        tmp_path / "suite",
        sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", f"--basetemp={tmp_path / 'suite' / 'home' / 'pytest'}",
        "tests/sandbox/test_sandbox.py", "tests/envs/test_env_code.py",
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    # Every isolation test ran (none skipped for want of isolation) and in the user-namespace mode.
    assert "skipped" not in result.stdout.splitlines()[-1], result.stdout[-2000:]
    probe = _as_normal_user(
        tmp_path / "probe", sys.executable, "-c",
        "import os; from pettingllms_verl.sandbox import client; print(os.geteuid(), sorted(k for k, v in client.isolation().items() if v))",
    )
    assert probe.stdout.split("\n")[0] == "65534 ['filesystem', 'network', 'pid_namespace', 'user_namespace']", probe.stderr


def test_without_isolation_code_runs_only_when_the_user_opts_in(tmp_path):
    code = "from pettingllms_verl.sandbox import run_python; print(run_python('print(6 * 7)').stdout, end='')"
    refused = _as_normal_user(tmp_path / "refused", sys.executable, "-c", code, no_user_namespaces=True)
    assert refused.returncode != 0 and refused.stdout == ""
    last = refused.stderr.strip().splitlines()[-1]
    assert last.startswith("pettingllms_verl.sandbox.client.SandboxUnavailable: sandbox: this OS refuses")
    assert ALLOW_UNISOLATED_ENV in last and "network" in last and "every file" in last

    allowed = _as_normal_user(
        tmp_path / "allowed", sys.executable, "-c", code, no_user_namespaces=True, env={ALLOW_UNISOLATED_ENV: "1"}
    )
    assert (allowed.returncode, allowed.stdout) == (0, "42\n"), allowed.stderr
    assert f"WARNING sandbox: {ALLOW_UNISOLATED_ENV}=1, model-written code runs exposed to:" in allowed.stderr
