"""Kill a training run the hard way: SIGKILL to the driver and to everything it started."""

import contextlib
import os
import signal
import subprocess
import time

import psutil


def kill_when(argv: list[str], ready, *, cwd, env, timeout_s: float = 900) -> int:
    """Start ``argv`` in a session of its own, wait until ``ready()`` is true, then SIGKILL the
    driver and every process it started (Ray's, some in process groups of their own), and wait
    until all are gone, so that a rerun meets none of them. Returns the driver's exit status."""
    process = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + timeout_s
    try:
        while not ready():
            assert process.poll() is None, f"the run ended (status {process.returncode}) before the moment to kill it"
            assert time.monotonic() < deadline, "the moment to kill the run never came"
            time.sleep(0.01)
        try:
            tree = psutil.Process(process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            tree = []
        process.kill()  # the driver first, as a crash or an OOM kill would
        for child in tree:
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()
        psutil.wait_procs(tree, timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    return process.returncode

