"""Program runs forked from a warm process: a function program's module is imported once per
rollout process, and each run is a fork of that process, not a new interpreter.

Starting Python and importing a client library (``openai``, ``langgraph``) costs about a second of
CPU per run, and tree sampling by replay multiplies runs; a fork costs milliseconds. The server,
``python -m pettingllms_verl.programs.forks FD TARGET``, imports the target's module (and the
``openai`` client when installed), then forks one child per request. Each child is a run: a new
session (its process group is killed when the run ends, as a spawned program's is), the run's
variables in its environment, the caller's pipes as stdout and stderr; it calls the function as
``runner.call`` does and exits. A module that has started threads by the time it is imported is
not forked from (a fork copies locks held by other threads): its runs are spawned as before.

The socket is a SOCK_SEQPACKET pair: a request is the run's variables as JSON with the two pipe
ends as SCM_RIGHTS; the answer is the child's pid.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import traceback

from pettingllms_verl.programs.runner import call
from pettingllms_verl.targets import load_target

READY_TIMEOUT_S = 120.0  # importing the module (and its framework) in the server


class ForkServerError(RuntimeError):
    """The server could not start (the module failed to import): the message is its stderr."""


class ForkServer:
    """The caller's side: one server per (target, directory) per process, restarted if it died."""

    def __init__(self, target: str, cwd: str | None):
        self.target, self.cwd = target, cwd
        self._lock = threading.Lock()
        self._process: subprocess.Popen | None = None
        self._sock: socket.socket | None = None
        self.fork_safe = True

    def _start(self) -> None:
        if self._sock is not None:  # the server died: let go of its socket and pipe
            self._sock.close()
            self._process.stderr.close()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._process = subprocess.Popen(
            [sys.executable, "-m", __name__, str(theirs.fileno()), self.target], pass_fds=(theirs.fileno(),), cwd=self.cwd,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )
        theirs.close()
        ours.settimeout(READY_TIMEOUT_S)
        try:
            ready = ours.recv(4096)
        except TimeoutError:
            ready = b""
        if not ready:
            self._process.kill()
            error = self._process.communicate()[1].decode(errors="replace")[-4000:]
            self._process, self._sock = None, None
            raise ForkServerError(f"the program's module did not load in its fork server: {error or 'no answer'}")
        self.fork_safe = bool(json.loads(ready)["fork_safe"])
        ours.settimeout(None)
        self._sock = ours

    def spawn(self, variables: dict[str, str], stdout: int, stderr: int) -> int | None:
        """Fork a run with ``variables`` in its environment and these pipe ends as its output;
        its pid, or None where the module is not fork-safe (spawn the run instead). Blocking: call
        it from a thread."""
        with self._lock:
            if self._process is None or self._process.poll() is not None:
                self._start()
            if not self.fork_safe:
                return None
            socket.send_fds(self._sock, [json.dumps(variables).encode()], [stdout, stderr])
            return int(self._sock.recv(64))


def _child(fn, variables: dict, fds: list[int]) -> None:
    code = 1
    try:
        os.setsid()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        stdin = os.open(os.devnull, os.O_RDONLY)
        os.dup2(stdin, 0)
        os.dup2(fds[0], 1)
        os.dup2(fds[1], 2)
        for fd in (stdin, *fds):
            os.close(fd)
        os.environ.update(variables)
        call(fn)
        code = 0
    except BaseException:
        traceback.print_exc()
        print("\n(the program raised: no reward)")  # its caller sees no exit status: a last line that is no reward
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def serve(fd: int, target: str) -> None:
    sock = socket.socket(fileno=fd)
    fn = load_target(target)
    try:
        import openai  # noqa: F401  (the client every run makes: imported once, here)
    except ImportError:
        pass
    fork_safe = threading.active_count() == 1
    sock.send(json.dumps({"fork_safe": fork_safe}).encode())
    if not fork_safe:
        return
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel: their callers read their output
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(sock, 1 << 20, 2)
        except OSError:
            return
        if not message:  # the caller is gone
            return
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            sock.close()
            _child(fn, json.loads(message), list(fds))
        for descriptor in fds:
            os.close(descriptor)
        sock.send(str(pid).encode())


if __name__ == "__main__":
    serve(int(sys.argv[1]), sys.argv[2])
