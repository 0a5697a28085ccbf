"""One training run of a benchmark through ``python -m verl.trainer.main_ppo``, its output kept."""

import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the threads of each side, the rollout server and torch in the trainer's Ray workers (base/cpu_one_run's keys)
THREADS = ["++actor_rollout_ref.rollout.engine_kwargs.hf.torch_threads={n}", '++ray_kwargs.ray_init.runtime_env.env_vars.OMP_NUM_THREADS="{n}"']


def train(name: str, recipe: str, overrides: list[str], *, root: str, log: str, env: dict[str, str]) -> None:
    """Run ``recipe`` with ``overrides`` in ``root``, verl's file logger writing ``log``; its output
    beside it (``<log>.log``). Exits naming that file when the run fails."""
    command = [sys.executable, "-m", "verl.trainer.main_ppo", "--config-path", os.path.join(REPO, "recipes"), "--config-name", recipe, *overrides]
    output_path = log.removesuffix(".jsonl") + ".log"
    started = time.monotonic()
    print(f"[{name}] {recipe} ...", flush=True)
    with open(output_path, "w") as output:
        result = subprocess.run(command, cwd=root, env={**env, "VERL_FILE_LOGGER_PATH": log, "HF_HUB_OFFLINE": "1"},
                                stdout=output, stderr=subprocess.STDOUT)
    if result.returncode != 0:
        sys.exit(f"[{name}] main_ppo exited {result.returncode}; its output: {output_path}")
    print(f"[{name}] done in {time.monotonic() - started:.0f} s", flush=True)
