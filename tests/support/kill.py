"""Kill a training run the hard way: SIGKILL to the driver and to everything it started."""

import contextlib
import os
import signal
import subprocess
import tempfile
import time

import psutil

from support.launch import ray_did_not_start


def kill_when(argv: list[str], ready, *, cwd, env, timeout_s: float = 900, log=None) -> int:
    """Start ``argv`` in a session of its own, wait until ``ready()`` is true, then SIGKILL the
    driver and every process it started (Ray's, some in process groups of their own), and wait
    until all are gone, so that a rerun meets none of them. Returns the driver's exit status. A run
    that ended before the moment because Ray did not start (``launch.ray_did_not_start``) starts again, once.
    ``log``: a file to keep the run's output in (else it is dropped)."""
    for attempt in (1, 2):
        with (open(log, "w+") if log is not None else tempfile.TemporaryFile("w+")) as output:
            process = subprocess.Popen(argv, cwd=cwd, env=env, stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
            deadline = time.monotonic() + timeout_s
            try:
                while not ready():
                    if process.poll() is not None:
                        break
                    assert time.monotonic() < deadline, "the moment to kill the run never came"
                    time.sleep(0.01)
                else:
                    _kill_tree(process)
                    return process.returncode
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
            output.seek(0)
            said = output.read()
        if attempt == 2 or not ray_did_not_start(said):
            raise AssertionError(f"the run ended (status {process.returncode}) before the moment to kill it:\n{said[-3000:]}")


def logged_steps(metrics_path) -> int:
    """How many steps verl's file logger has written whole to ``metrics_path`` (one line per step,
    logged after the step's checkpoint and validation)."""
    try:
        return metrics_path.read_text().count("\n")
    except FileNotFoundError:
        return 0


def _kill_tree(process: subprocess.Popen) -> None:
    try:
        tree = psutil.Process(process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        tree = []
    process.kill()  # the driver first, as a crash or an OOM kill would
    for child in tree:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()
    psutil.wait_procs(tree, timeout=60)
    process.wait()
