"""A Ray cluster of several nodes on this machine, as `ray start` builds one on a real cluster: a
head and worker nodes, each a raylet of its own on the loopback address, in a temporary folder of
its own (so no other test's ``ray.init()`` finds it), removed with every process it started."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil

RAY = [sys.executable, "-c", "from ray.scripts.scripts import main; main()"]
LOOPBACK = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


class LocalCluster:
    """``nodes`` Ray nodes, each with ``gpus`` Ray GPU slots (trainer ranks on CPU) and a custom
    resource ``node<i>`` naming it."""

    def __init__(self, root: Path, nodes: int, gpus: int = 1, cpus: int = 8):
        self.root, self.port = root, free_port()
        self.address = f"{LOOPBACK}:{self.port}"
        self.temp_dirs = [root / f"ray{i}" for i in range(nodes)]
        for i, temp_dir in enumerate(self.temp_dirs):
            where = ["--head", f"--port={self.port}", "--include-dashboard=false"] if i == 0 else [f"--address={self.address}"]
            self._ray("start", *where, f"--node-ip-address={LOOPBACK}", f"--num-cpus={cpus}", f"--num-gpus={gpus}",
                      f"--resources={json.dumps({f'node{i}': 1})}", f"--temp-dir={temp_dir}", "--disable-usage-stats")
        self.wait_for(nodes)

    def _ray(self, *args: str) -> None:
        result = subprocess.run([*RAY, *args], capture_output=True, text=True, timeout=180, env=self.env())
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

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
        """``node<i>`` -> its Ray node id."""
        return {name: node["NodeID"] for node in self.nodes() for name in node["Resources"] if name.startswith("node") and name[4:].isdigit()}

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
        """SIGKILL a node's processes (all nodes' with None), as a machine that dies."""
        victims = self.processes(node)
        for process in victims:
            with contextlib.suppress(psutil.Error):
                process.send_signal(signal.SIGKILL)
        psutil.wait_procs(victims, timeout=60)

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc) -> None:
        self.kill()
