"""The tests' launcher runs a command once more only when Ray itself did not start
(ray-project/ray#65983), and the kill-and-resume helper does the same before its moment."""

import sys

import pytest

from support import launch
from support.kill import kill_when

# fails like Ray's start-up the first time (a marker file remembers), then does what the test says
FLAKY = """import pathlib, sys, time
marker = pathlib.Path(sys.argv[1])
if not marker.exists():
    marker.write_text("started once")
    print("Exception: The current node timed out during startup. This could happen because ...", file=sys.stderr)
    sys.exit(1)
if sys.argv[2] == "wait":
    pathlib.Path(sys.argv[3]).write_text("ready")
    time.sleep(60)
sys.exit(int(sys.argv[2]))
"""


def test_a_command_runs_again_once_when_ray_did_not_start(tmp_path, capsys):
    result = launch.run([sys.executable, "-c", FLAKY, str(tmp_path / "marker"), "0"], timeout=60)
    assert result.returncode == 0 and "again" in capsys.readouterr().err
    twice = launch.run([sys.executable, "-c", FLAKY, str(tmp_path / "other"), "0"], attempts=1, timeout=60)
    assert twice.returncode == 1 and "timed out during startup" in twice.stderr  # attempts=1: returned as it is


def test_any_other_failure_is_returned_at_once(tmp_path):
    (tmp_path / "marker").write_text("")  # past the Ray failure: the command itself fails
    result = launch.run([sys.executable, "-c", FLAKY, str(tmp_path / "marker"), "3"], timeout=60)
    assert result.returncode == 3


def test_the_kill_helper_starts_again_when_ray_did_not_start_and_says_why_otherwise(tmp_path):
    ready = tmp_path / "ready"
    status = kill_when([sys.executable, "-c", FLAKY, str(tmp_path / "marker"), "wait", str(ready)], ready.exists, cwd=tmp_path, env=None)
    assert status == -9
    (tmp_path / "m2").write_text("")
    with pytest.raises(AssertionError, match="the run ended \\(status 4\\) before the moment to kill it"):
        kill_when([sys.executable, "-c", FLAKY, str(tmp_path / "m2"), "4"], lambda: False, cwd=tmp_path, env=None)
