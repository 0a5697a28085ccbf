"""The plugin registers itself with verl in a fresh process, and verl picks the cpu platform."""

import os
import subprocess
import sys

import pytest

PROBE = r"""
import verl, torch
from verl.plugin.platform import get_platform
from verl.utils.device import get_device_name, get_nccl_backend
from verl.workers.engine import EngineRegistry
from verl.workers.rollout.base import get_rollout_class
from verl.workers.rollout.replica import RolloutReplicaRegistry
import pettingllms_verl.registration as registration
print("device", get_device_name(), get_nccl_backend())
print("missing", registration._check())
print("replica", RolloutReplicaRegistry.get("hf").__name__)
print("adapter", get_rollout_class("hf", "async").__name__)
print("engine", EngineRegistry.get_engine_cls("language_model", "fsdp2").__name__)
# verl's own process-group init builds "cpu:gloo,cpu:gloo"; it must work on this platform.
os_env = __import__("os").environ
os_env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533", RANK="0", WORLD_SIZE="1")
from verl.utils.distributed import initialize_global_process_group_ray
initialize_global_process_group_ray()
print("pg", torch.distributed.get_backend())
"""


def run_probe(**env):
    env = {**os.environ, "VERL_USE_EXTERNAL_PLUGINS": "auto", **env}
    env.pop("VERL_PLATFORM", None)
    return subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=300)


@pytest.fixture(scope="module")
def probe():
    result = run_probe()
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def test_cpu_platform_is_auto_detected_with_one_log_line(probe):
    assert "device cpu gloo" in probe.stdout
    assert probe.stderr.count("using the embedded CPU platform") == 1


def test_all_registrations_present_in_a_fresh_process(probe):
    assert "missing []" in probe.stdout
    assert "replica HFRolloutReplica" in probe.stdout
    assert "adapter HFServerAdapter" in probe.stdout
    assert "engine FSDPEngineWithLMHead" in probe.stdout


def test_verl_process_group_init_works_on_cpu(probe):
    assert "pg gloo" in probe.stdout


def test_plugin_disabled_means_no_cpu_platform():
    # Negative control: the probe's results come from the entry point, not from test imports.
    result = subprocess.run(
        [sys.executable, "-c", "import verl; from verl.plugin.platform import PlatformRegistry; "
         "print(PlatformRegistry.get('cpu'))"],
        capture_output=True, text=True, env={**os.environ, "VERL_USE_EXTERNAL_PLUGINS": "none"}, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "None"


def test_registration_failure_is_loud(monkeypatch, capsys):
    """A registration that did not take (verl's replica registry drops it) is caught by the real
    self-check, loudly."""
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    import pettingllms_verl.registration as registration

    monkeypatch.setattr(registration, "_registered", False)
    monkeypatch.delitem(RolloutReplicaRegistry._registry, "hf")
    monkeypatch.setattr(RolloutReplicaRegistry, "register", staticmethod(lambda *args, **kwargs: None))
    with pytest.raises(RuntimeError, match="rollout replica 'hf'"):
        registration.register()
    assert "plugin registration FAILED" in capsys.readouterr().err


def test_importing_a_module_of_ours_first_does_not_break_registration():
    """verl, imported by one of our own modules, calls the plugin back mid-import: no circular
    import error, and a later register() registers everything."""
    import subprocess
    import sys

    code = ("import pettingllms_verl.algo\n"
            "from pettingllms_verl.registration import _check, register\n"
            "register()\n"
            "assert _check() == [], _check()\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "registration FAILED" not in result.stderr
