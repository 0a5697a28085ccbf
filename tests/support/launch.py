"""Launch verl's ``main_ppo`` from a test, once more when Ray itself did not start.

Under a heavy outside load Ray's raylet can give up at start-up after waiting 15 s for its
dashboard agent (ray-project/ray#65983: a hard-coded timeout that no setting raises, and a full Ray
install always starts the agent). Nothing of the run has started then, so the same command runs
again, once; any other failure is returned as it is.
"""

import subprocess
import sys

# what Ray says when its node did not come up (the driver's error, and the raylet's cause where it is shown)
RAY_DID_NOT_START = ("timed out during startup", "metrics_agent_port", "WaitForDashboardAgentPorts")
MAIN_PPO = [sys.executable, "-m", "verl.trainer.main_ppo"]


def ray_did_not_start(output: str) -> bool:
    return any(sign in output for sign in RAY_DID_NOT_START)


def run(argv: list[str], *, attempts: int = 2, **kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run(argv, capture_output=True, text=True, **kwargs)``, again when Ray did not start."""
    for attempt in range(1, attempts + 1):
        result = subprocess.run(argv, capture_output=True, text=True, **kwargs)
        if result.returncode == 0 or attempt == attempts or not ray_did_not_start(result.stdout + result.stderr):
            return result
        print(f"Ray did not start (ray-project/ray#65983): running {argv[:4]} ... again", file=sys.stderr)
    raise AssertionError("unreachable")


def main_ppo(*args: str, **kwargs) -> subprocess.CompletedProcess:
    """``python -m verl.trainer.main_ppo ARGS`` through ``run``."""
    return run([*MAIN_PPO, *args], **kwargs)


def checked(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    """``run`` a command that must succeed (pip, main_ppo): its output in the failure."""
    result = run(argv, timeout=900, **kwargs)
    assert result.returncode == 0, (argv, result.stdout[-3000:], result.stderr[-3000:])
    return result
