"""Caller side: ``run_python`` and the lifecycle of the fork server (see ``server``).

Thread-safe: each call borrows a connection of its own from a pool, so concurrent callers never
share a socket and wait only in the kernel (the GIL is released while the run goes on).
"""

import atexit
import contextlib
import fcntl
import functools
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass

from pettingllms_verl.sandbox.protocol import recv_frame, send_frame

# Beyond its wall limit a run may also wait its turn behind MAX_PARALLEL others; a reply later
# than this means the server is wedged, which is raised, never waited out.
_REPLY_GRACE_S = 300.0
# A run waits this long at most for one of the machine's slots; longer means another process
# holds them without running anything (wedged), which is raised, never waited out.
_SLOT_WAIT_S = 300.0
_SERVER_START_TIMEOUT_S = 30.0
# The server (run with -I: no environment, no user site) imports the package from where this client
# was imported, so a source checkout on PYTHONPATH works as an install does.
_SERVER_MAIN = (
    f"import sys; p = {os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))!r}; p in sys.path or sys.path.append(p); "
    "from pettingllms_verl.sandbox.server import main; main(sys.argv)"
)
# Runs beyond this wait, so a burst of rollouts cannot starve the trainer. The cap holds per
# machine: every rollout worker starts its own server, and they share the slots below.
MAX_PARALLEL = 2 * (os.cpu_count() or 1)
SLOTS_DIR = os.path.join("/dev/shm" if os.access("/dev/shm", os.W_OK) else tempfile.gettempdir(), "pettingllms-sandbox-slots")
# Set to 1 to run model-written code where the OS grants no isolation (see SandboxUnavailable).
ALLOW_UNISOLATED_ENV = "PETTINGLLMS_SANDBOX_ALLOW_UNISOLATED"


class SandboxUnavailable(RuntimeError):
    """The OS grants no isolation here and the user has not opted in to run code without it."""

    def __init__(self, problem: str, fix: str):
        super().__init__(f"sandbox: {problem}. Fix: {fix}")
        self.problem, self.fix = problem, fix


def exposure(isolation: dict) -> list[str]:
    """What model-written code can reach on this machine, given the server's hello frame."""
    exposed = []
    if not isolation["filesystem"]:
        exposed.append("every file the trainer's user can read or write (datasets, checkpoints, home, /etc)")
    if not isolation["network"]:
        exposed.append("the network (the host's loopback services and the internet)")
    if not (isolation["drop_uid"] or isolation["pid_namespace"]):
        exposed.append("the trainer's processes (same uid: it can signal them; processes that call setsid outlive their run)")
    return exposed


def _refuse_or_warn(isolation: dict) -> None:
    exposed = exposure(isolation)
    if not exposed:
        return
    what = "; ".join(exposed)
    if os.environ.get(ALLOW_UNISOLATED_ENV) == "1":
        print(f"WARNING sandbox: {ALLOW_UNISOLATED_ENV}=1, model-written code runs exposed to: {what}", file=sys.stderr)
        return
    raise SandboxUnavailable(
        f"this OS refuses the isolation model-written code needs, which would reach {what}",
        "run as root, or allow unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1, "
        "user.max_user_namespaces > 0, kernel.apparmor_restrict_unprivileged_userns=0; in Docker a seccomp "
        f"profile that permits unshare), or accept the exposure with {ALLOW_UNISOLATED_ENV}=1 in the environment "
        "of the trainer and of every Ray worker",
    )


@dataclass(frozen=True)
class SandboxLimits:
    wall_s: float = 5.0  # wall-clock seconds before the run's processes are killed (status "timeout")
    cpu_s: int = 5  # CPU seconds per process (RLIMIT_CPU); beyond it the kernel kills it (status "killed")
    memory_mb: int = 512  # address space per process (RLIMIT_AS), MiB; allocations beyond it fail
    max_output_bytes: int = 64_000  # cap per stream; beyond it the run is killed (status "output_too_large")

    def __post_init__(self):
        if self.wall_s <= 0 or self.cpu_s < 1 or self.memory_mb < 1 or self.max_output_bytes < 0:
            raise ValueError(f"invalid sandbox limits: {self}")


@dataclass(frozen=True)
class SandboxResult:
    status: str  # "ok" | "error" | "timeout" | "killed" | "output_too_large"
    stdout: str
    stderr: str
    returncode: int | None  # exit code, or -signal number when killed (as in subprocess)
    wall_s: float  # seconds the run took, from fork to exit (time queued excluded)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def transcript(self, stderr_chars: int = 300) -> str:
        """What another agent is shown of the run: stdout, and on failure the status and the end of stderr."""
        return self.stdout if self.ok else f"[{self.status}] {self.stdout}\n{self.stderr[-stderr_chars:]}".strip()


class _ForkServerHandle:
    def __init__(self):
        self._control, server_end = socket.socketpair()
        self.process = subprocess.Popen(
            [sys.executable, "-I", "-c", _SERVER_MAIN, str(server_end.fileno()), str(MAX_PARALLEL)],
            pass_fds=[server_end.fileno()],
            env={},  # nothing of the trainer's environment, secrets included, reaches the server
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C meant for the trainer does not kill runs mid-way
        )
        server_end.close()
        self._lock = threading.Lock()
        self._idle: list[socket.socket] = []
        self._control.settimeout(_SERVER_START_TIMEOUT_S)
        try:
            self.isolation: dict = recv_frame(self._control)
            _refuse_or_warn(self.isolation)
        except BaseException:
            self.close()
            raise

    def call(self, request: dict, timeout_s: float) -> dict:
        conn = self._borrow()
        try:
            conn.settimeout(timeout_s)
            send_frame(conn, request)
            reply = recv_frame(conn)
        except BaseException:
            conn.close()  # the server kills a run whose caller hangs up
            raise
        with self._lock:
            self._idle.append(conn)
        return reply

    def _borrow(self) -> socket.socket:
        with self._lock:
            if self._idle:
                return self._idle.pop()
            ours, theirs = socket.socketpair()
            with theirs:
                socket.send_fds(self._control, [b"c"], [theirs.fileno()])
            return ours

    def is_dead(self) -> bool:
        try:
            self.process.wait(timeout=10.0)  # one that just died may not have exited yet (PID 1 of its namespace waits for it to empty)
        except subprocess.TimeoutExpired:
            return False
        return True

    def close(self) -> None:
        """Closing the control socket tells the server to kill its runs and exit."""
        for conn in self._idle:
            conn.close()
        self._control.close()
        try:
            self.process.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@contextlib.contextmanager
def _machine_slot():
    """Hold one of MAX_PARALLEL machine-wide slots for the length of a run: an flock on one of
    MAX_PARALLEL files, which the kernel releases if the holder dies, so no slot is ever lost."""
    _make_slots_dir()
    order = random.sample(range(MAX_PARALLEL), MAX_PARALLEL)  # spread callers over the slots
    wait_s, deadline = 0.001, time.monotonic() + _SLOT_WAIT_S
    while True:
        for slot in order:
            fd = _open_slot(slot)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            try:
                yield
            finally:
                os.close(fd)  # releases the lock
            return
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"sandbox: all {MAX_PARALLEL} run slots of this machine ({SLOTS_DIR}) stayed taken for {_SLOT_WAIT_S:g} s; "
                "another process holds them (`fuser -v` on the slot files names it)"
            )
        time.sleep(wait_s)  # every slot busy: poll (a blocking flock would wait on one slot only)
        wait_s = min(2 * wait_s, 0.02)


@functools.cache
def _make_slots_dir() -> None:
    os.makedirs(SLOTS_DIR, exist_ok=True)
    with contextlib.suppress(PermissionError):  # someone else's: they made it shared
        os.chmod(SLOTS_DIR, 0o1777)  # whatever the umask, other users' trainers share the slots


def _open_slot(slot: int) -> int:
    path = os.path.join(SLOTS_DIR, f"slot-{slot}")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o666)
    except PermissionError:  # made by another user in a directory we may not write: read is enough
        fd = os.open(path, os.O_RDONLY)
    return fd


_server: _ForkServerHandle | None = None
_server_lock = threading.Lock()
_refusal: SandboxUnavailable | None = None  # the OS's answer does not change within a process


def _current_server() -> _ForkServerHandle:
    global _server, _refusal
    with _server_lock:
        if _refusal is not None:
            raise _refusal
        if _server is None:
            try:
                _server = _ForkServerHandle()
            except SandboxUnavailable as exc:
                _refusal = exc
                raise
        return _server


def _discard_if_dead(server: _ForkServerHandle) -> None:
    global _server
    if not server.is_dead():
        return
    with _server_lock:
        if _server is server:
            _server = None
    server.close()


def _shutdown() -> None:
    global _server
    with _server_lock:
        server, _server = _server, None
    if server is not None:
        server.close()


def _forget_after_fork() -> None:
    """A forked copy of the trainer must start its own server, not share its parent's sockets."""
    global _server, _server_lock
    _server_lock = threading.Lock()
    if _server is not None:
        for conn in [*_server._idle, _server._control]:
            conn.close()  # only this process's copies; the parent keeps its server
        _server = None


atexit.register(_shutdown)
os.register_at_fork(after_in_child=_forget_after_fork)


def isolation() -> dict:
    """What the OS granted the server (see ``server``): {"network", "filesystem",
    "user_namespace", "pid_namespace", "drop_uid", "keep_read"}, each a bool."""
    return dict(_current_server().isolation)


def run_python(code: str, stdin: str = "", limits: SandboxLimits | None = None) -> SandboxResult:
    """Run `code` as ``python -c`` would, in a sandboxed process; never in this one.

    Raises RuntimeError only when the sandbox itself fails (its server died twice in a row or is
    wedged) and SandboxUnavailable where the OS grants no isolation and the user did not opt in;
    every outcome of the code itself is a SandboxResult.
    """
    limits = limits or SandboxLimits()
    request = {
        "code": code,
        "stdin": stdin.encode("utf-8", "surrogatepass"),  # never raises, whatever the str holds
        "wall_s": float(limits.wall_s),
        "cpu_s": int(limits.cpu_s),
        "memory_mb": int(limits.memory_mb),
        "max_output_bytes": int(limits.max_output_bytes),
    }
    failure: Exception | None = None
    for _ in range(2):  # one retry, on a restarted server if the first one died
        server = _current_server()
        try:
            with _machine_slot():
                reply = server.call(request, timeout_s=limits.wall_s + _REPLY_GRACE_S)
        except TimeoutError as exc:
            raise RuntimeError("sandbox fork server did not reply in time") from exc
        except OSError as exc:  # the server died (peer closed), or a concurrent caller that found it dead closed its sockets (EBADF)
            failure = exc
            _discard_if_dead(server)
            continue
        return SandboxResult(
            status=reply["status"],
            stdout=reply["stdout"].decode("utf-8", "replace"),
            stderr=reply["stderr"].decode("utf-8", "replace"),
            returncode=reply["returncode"],
            wall_s=reply["wall_s"],
        )
    raise RuntimeError("sandbox fork server failed") from failure
