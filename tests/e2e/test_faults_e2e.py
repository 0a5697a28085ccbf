"""A result made of failures is not a result: through ``pettingllms-eval`` and ``main_ppo`` on CPU, a
rollout server killed mid-evaluation stops it (non-zero, the message names the server, no success
reported); a trainer rank killed mid-step stops training (non-zero, within a bound, the message names
the rank and its node), the last checkpoint intact; an environment that raises on every episode stops training at the fault budget, the last
checkpoint intact. (A fault under the budget costs its episode, counted in the evaluation's table:
``test_policies_e2e.py``'s evaluation plays one.) The faults come on deterministic cues
(``faulty_env.py``), never on a timer."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from pettingllms_verl.eval.reproduce.training import finished_steps

from support import RECIPES, faulty_env, launch

pytestmark = pytest.mark.slow
RECIPE = "plan_path_mas_atgrpo_cpu"  # L0, the hf rollout: one HFRolloutServer
FAULTY = faulty_env.OVERRIDE


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    from pettingllms_verl.data.rows import write_parquet
    from pettingllms_verl.envs.splits import generate_splits
    from pettingllms_verl.models.tiny import build

    root = tmp_path_factory.mktemp("faults")
    build(str(root / "tiny_model_plan_path"), seed=0)  # untrained: faults, not learning, are under test
    for split, rows in generate_splits("plan_path", {"train": 8, "val": 2, "test": 4}, {"size": 6}).items():
        write_parquet(rows, str(root / "data" / "plan_path_6x6" / f"{split}.parquet"))
    return root


def test_an_env_raising_on_every_episode_stops_training_at_the_fault_budget_keeping_the_last_checkpoint(artifacts):
    """Step 1 plays clean and is saved; from then on every step raises (the cue: the run's own
    checkpoint tracker). Step 2 stops before its update: no step 2 checkpoint, step 1's untouched."""
    checkpoints = artifacts / "checkpoints" / RECIPE
    result = launch.main_ppo(
        "--config-path", RECIPES, "--config-name", RECIPE, FAULTY, "trainer.total_training_steps=2",
        f"+pettingllms.env_kwargs.fail_once_exists={checkpoints / 'latest_checkpointed_iteration.txt'}",
        timeout=1200, cwd=artifacts,
        env={**os.environ, "PETTINGLLMS_ARTIFACTS": str(artifacts), "VERL_FILE_LOGGER_PATH": str(artifacts / "budget.jsonl")},
    )
    said = result.stdout + result.stderr
    assert result.returncode != 0, said[-3000:]
    # step 2: 2 problems, each a tree whose first step raised
    assert "pettingllms-verl stopped the run: training step 2: 2 of 2 episodes ended by a fault (env_error 2), a share of 1.00, " \
           "over pettingllms.trainer.fault_budget=0.5; no success rate is reported for it." in said
    assert "--- first env_error ---" in said and "RuntimeError: the environment broke: " in said
    assert (checkpoints / "latest_checkpointed_iteration.txt").read_text().strip() == "1"
    assert sorted(p.name for p in checkpoints.iterdir() if p.name.startswith("global_step_")) == ["global_step_1"]
    (step1,) = [json.loads(line) for line in open(artifacts / "budget.jsonl")]  # step 2 never logged
    assert step1["step"] == 1 and step1["data"]["mas/fault_share"] == 0.0


def ray_actors(root: psutil.Process, title: str) -> list[psutil.Process]:
    """The processes among ``root``'s descendants of Ray actors of class ``title`` (Ray titles an
    actor's process ``ray::<class>``)."""
    found = []
    for process in root.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if f"ray::{title}" in " ".join(process.cmdline()):
                found.append(process)
    return found


def killed_while_held(command: list[str], hold, title: str, env: dict) -> tuple[subprocess.CompletedProcess, float]:
    """Run ``command`` until its episodes are held at a prompt (``hold``: faulty_env's hold_dir),
    SIGKILL its one Ray actor of class ``title`` (the OOM killer's way), let the episodes go on, and
    wait for the end: the result, and the seconds from the kill to the exit."""
    for _attempt in (1, 2):  # once more only where Ray itself did not start (launch.ray_did_not_start)
        process = subprocess.Popen(command, cwd=env["PETTINGLLMS_ARTIFACTS"], env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        killed = time.monotonic()
        try:
            deadline = time.monotonic() + 900
            while not (hold / "started").exists() and process.poll() is None:
                assert time.monotonic() < deadline, "the episodes never started"
                time.sleep(0.05)
            if process.poll() is None:
                (actor,) = ray_actors(psutil.Process(process.pid), title)
                actor.kill()
                actor.wait(timeout=60)
                killed = time.monotonic()
                (hold / "go").touch()
            stdout, stderr = process.communicate(timeout=600)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        if (hold / "started").exists() or not launch.ray_did_not_start(stdout + stderr):
            return subprocess.CompletedProcess(command, process.returncode, stdout, stderr), time.monotonic() - killed


def test_a_rollout_server_killed_mid_evaluation_stops_it_naming_the_server_and_reports_no_success(artifacts, tmp_path):
    """The server's process SIGKILLed while the evaluation's episodes are in flight (held at their
    first prompt until the kill is done, so every one of them meets the dead server)."""
    hold = tmp_path / "hold"
    hold.mkdir()
    out = artifacts / "eval_server_killed"
    command = [sys.executable, "-m", "pettingllms_verl.eval", RECIPE, "--out", str(out), "--recipes", RECIPES,
               "--set", FAULTY, "--set", f"+pettingllms.env_kwargs.hold_dir={hold}"]
    result, _ = killed_while_held(command, hold, "HFRolloutServer", {**os.environ, "PETTINGLLMS_ARTIFACTS": str(artifacts)})
    stdout, stderr = result.stdout, result.stderr
    assert result.returncode == 1, stderr[-3000:]
    assert f"pettingllms-eval: run {RECIPE}: main_ppo exited with" in stderr
    stop = stderr[stderr.index("pettingllms-verl stopped the run: validation at step 0: a rollout server is dead"):]
    assert "policy 'shared'" in stop and "its rollout server is dead" in stop
    assert "HFRolloutServer" in stop and "The actor is dead because its worker process has died" in stop  # Ray's word: which actor, why
    assert not (out / "results.md").exists() and not (out / "results.json").exists()  # no success rate for it
    assert "success" not in stdout


STOP_BOUND_S = 300  # from a trainer rank's death to main_ppo's exit: a hang guard (measured: docs/faults-and-sandbox.md)


def test_a_trainer_rank_killed_mid_step_stops_the_run_naming_it_and_keeps_the_last_checkpoint(artifacts, tmp_path):
    """The trainer rank's process SIGKILLed while step 2's episodes are in flight (held at their
    first prompt, from step 1's checkpoint on): the step stops at its first call to the rank, within
    a bound, with one message naming the rank, its node and Ray's cause; step 1's checkpoint is whole."""
    hold, checkpoints = tmp_path / "hold", artifacts / "checkpoints" / "rank_killed"
    hold.mkdir()
    command = [*launch.MAIN_PPO, "--config-path", RECIPES, "--config-name", RECIPE, FAULTY, "trainer.total_training_steps=2",
               "trainer.experiment_name=rank_killed", f"+pettingllms.env_kwargs.hold_dir={hold}",
               f"+pettingllms.env_kwargs.hold_after={checkpoints / 'latest_checkpointed_iteration.txt'}"]
    metrics_path = tmp_path / "metrics.jsonl"
    result, stopped_after = killed_while_held(command, hold, "WorkerDict", {**os.environ, "PETTINGLLMS_ARTIFACTS": str(artifacts),
                                                                           "VERL_FILE_LOGGER_PATH": str(metrics_path)})
    said = result.stdout + result.stderr
    assert result.returncode != 0, said[-3000:]
    stop = said[said.index("pettingllms-verl stopped the run: training step 2: trainer rank 0 of shared on node "):]
    assert "died: " in stop and "The actor is dead because its worker process has died" in stop  # Ray's cause
    assert "the same command with trainer.resume_mode=auto continues from it" in stop
    assert stopped_after < STOP_BOUND_S, stopped_after
    assert [json.loads(line)["step"] for line in open(metrics_path)] == [1]
    assert finished_steps(checkpoints) == 1 and (checkpoints / "global_step_1" / "data.pt").exists()
    print(f"trainer rank killed: main_ppo stopped {stopped_after:.0f} s later")
