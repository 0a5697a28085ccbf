"""A Ray cluster of several nodes on this machine, as `ray start` builds one on a real cluster: a
head and worker nodes, each a raylet of its own, in a temporary folder of its own (so no other
test's ``ray.init()`` finds it), removed with every process it started.

Every node is started with ``--node-ip-address=127.0.0.1``; on Linux Ray advertises the machine's
own address in its place (``services.resolve_ip_for_localhost``), as it does for a single-node
``ray.init()``, so nothing leaves this machine."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from pettingllms_verl.placement import PLACEMENT

from support import RECIPES

RAY = [sys.executable, "-c", "from ray.scripts.scripts import main; main()"]
LOOPBACK = "127.0.0.1"


def placement(output: str) -> dict:
    """A multi-agent run's placement lines (its trainer's and its episode workers'), merged."""
    found = {}
    for line in output.splitlines():
        if PLACEMENT in line:
            found.update(json.loads(line.split(PLACEMENT, 1)[1]))
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


class LocalCluster:
    """One Ray node per name of ``names`` (the first the head), each with ``gpus`` Ray GPU slots
    (trainer ranks on CPU; per node name where a dict, 1 for a name it lacks) and a custom resource
    of its name."""

    def __init__(self, names: list[str] = ("a", "b"), gpus: int | dict[str, int] = 1, cpus: int = 8,
                 hide: dict[str, list[str]] | None = None):
        # short: Ray's socket paths under it must fit AF_UNIX's 107 bytes
        self.temp_dirs = [Path(tempfile.mkdtemp(prefix=f"ray{name}")) for name in names]
        self.names = list(names)
        try:
            for i, name in enumerate(names):
                slots = gpus.get(name, 1) if isinstance(gpus, dict) else gpus
                options = [f"--node-ip-address={LOOPBACK}", f"--num-cpus={cpus}", f"--num-gpus={slots}",
                           f"--resources={json.dumps({f'node_{name}': 1})}", f"--temp-dir={self.temp_dirs[i]}", "--disable-usage-stats"]
                hidden = (hide or {}).get(name, [])
                if i > 0:
                    self._start(hidden, f"--address={self.address}", *options)
                    continue
                for attempt in (1, 2, 3):  # the free port may be taken before Ray binds it: another port then
                    self.port = free_port()
                    self.address = f"{LOOPBACK}:{self.port}"
                    if self._start(hidden, "--head", f"--port={self.port}", "--include-dashboard=false", *options, last=attempt == 3):
                        break
                    self.kill(0)
            self.wait_for(len(names))
        except BaseException:
            self.kill()
            raise

    def _start(self, hidden: list[str], *args: str, last: bool = True) -> bool:
        """`ray start` with ``args``; a node that must not see the folders ``hidden`` starts in a
        mount namespace of its own with an empty tmpfs over each (``unshare``: as a machine without
        that mount). False where it failed and ``last`` is false."""
        command = [*RAY, "start", *args]
        if hidden:
            mounts = " && ".join(f"mount -t tmpfs none {shlex.quote(path)}" for path in hidden)
            command = ["unshare", "--map-root-user", "--mount", "sh", "-c", f"{mounts} && exec {shlex.join(command)}"]
        result = subprocess.run(command, capture_output=True, text=True, timeout=180, env=self.env())
        assert result.returncode == 0 or not last, result.stdout[-3000:] + result.stderr[-3000:]
        return result.returncode == 0

    def main_ppo_args(self, *overrides: str, worker_env: dict[str, str] | None = None) -> list[str]:
        """``main_ppo``'s arguments for a recipe run joining this cluster: Ray refuses num_cpus and
        num_gpus there, which the CPU recipes set (the preflight says so). The cluster's processes
        have the environment their node started with, so what verl's workers read from theirs
        (``worker_env``, e.g. VERL_FILE_LOGGER_PATH) goes in Ray's runtime environment."""
        return ["--config-path", RECIPES, *overrides, f"+ray_kwargs.ray_init.address={self.address}",
                "~ray_kwargs.ray_init.num_cpus", "~ray_kwargs.ray_init.num_gpus",
                *(f"+ray_kwargs.ray_init.runtime_env.env_vars.{key}={value}" for key, value in (worker_env or {}).items())]

    @staticmethod
    def env(base: dict | None = None) -> dict:
        """The environment of a process on the cluster: no token auth (Ray 2.60's `ray start` turns it
        on; every process here is on this machine), and no RAY_ADDRESS from outside."""
        return {**(os.environ if base is None else base), "RAY_AUTH_MODE": "disabled", "RAY_ADDRESS": ""}

    def nodes(self) -> list[dict]:
        """The live nodes as Ray lists them (``NodeID``, ``Resources``, ...)."""
        code = f"import json, ray; ray.init(address='{self.address}', logging_level='ERROR'); print(json.dumps([n for n in ray.nodes() if n['Alive']]))"
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=self.env())
        assert result.returncode == 0, result.stderr[-3000:]
        return json.loads(result.stdout.strip().splitlines()[-1])

    def node_ids(self) -> dict[str, str]:
        """Node name -> its Ray node id."""
        return {name: node["NodeID"] for node in self.nodes() for name in self.names if f"node_{name}" in node["Resources"]}

    def wait_for(self, count: int, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.nodes()) != count:
            assert time.monotonic() < deadline, f"{count} Ray nodes never came up"
            time.sleep(1)

    def processes(self, node: int | None = None) -> list[psutil.Process]:
        """The processes of every node (or of node ``node``): those whose command line names its
        temporary folder (the raylet, GCS, agents) and all they started (workers rename themselves)."""
        marks = [str(d) for d in (self.temp_dirs if node is None else [self.temp_dirs[node]])]
        found: dict[int, psutil.Process] = {}
        for process in psutil.process_iter(["cmdline"]):
            with contextlib.suppress(psutil.Error):
                if any(mark in " ".join(process.info["cmdline"] or ()) for mark in marks):
                    found[process.pid] = process
                    found.update((child.pid, child) for child in process.children(recursive=True))
        return list(found.values())

    def kill(self, node: int | None = None) -> None:
        """SIGKILL the processes of node number ``node`` (all nodes' with None), as a machine that dies."""
        victims = self.processes(node)
        for process in victims:
            with contextlib.suppress(psutil.Error):
                process.send_signal(signal.SIGKILL)
        psutil.wait_procs(victims, timeout=60)

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc) -> None:
        self.kill()
        for temp_dir in self.temp_dirs:
            shutil.rmtree(temp_dir, ignore_errors=True)
