"""Fork server: runs model-written Python in forked, locked-down children.

Started by the client as ``python -I -c "...; main(sys.argv)" CONTROL_FD MAX_PARALLEL`` (the
package's location put on sys.path, see ``client._SERVER_MAIN``) with an empty environment, so it
holds none of the trainer's state or secrets. It imports the stdlib and this package's
``protocol`` and ``isolation`` only (both stdlib-only).

One single-threaded event loop (forking from a threaded process is unsafe) serves every caller:
- the control socket receives one connected socket per client connection (fd passing, so no
  listening socket exists that sandboxed code could reach);
- a connection carries one request at a time; the reply is a dict (see ``protocol.result``);
- each run is a forked child: new session, fresh temp dir, cleared env, rlimits, nice, its own
  uid, then ``exec`` of the code. The loop enforces the wall limit and the output cap, and after
  every run kills its process group and every process left with the run's uid.

Isolation (namespaces, mounts, capabilities, uids) is set up by ``isolation``; see its docstring.
"""

import collections
import gc
import os
import resource
import selectors
import shutil
import signal
import socket
import sys
import tempfile
import time
import traceback
import types

from pettingllms_verl.sandbox import isolation
from pettingllms_verl.sandbox.protocol import recv_frame, result, send_frame

_READ_CHUNK = 65536
_NICENESS = 10  # runs yield the CPU to the trainer
_SETUP_FAILED_EXIT = 125
_PEER_TIMEOUT_S = 10.0  # a trusted peer that stalls mid-frame must not wedge the loop for longer

# Run directories on tmpfs: creating and removing one on a disk filesystem costs milliseconds.
_WORKDIR_ROOT = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None  # None: tempfile's default

_RUN_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}  # plus HOME and TMPDIR per run


class _Run:
    """One execution in flight (it keeps no copy of the code or its input)."""

    def __init__(self, conn, uid, workdir, pid, out_fd, err_fd, wall_s, max_output_bytes):
        self.conn, self.uid, self.workdir, self.pid = conn, uid, workdir, pid
        self.max_output_bytes = max_output_bytes
        self.pidfd = os.pidfd_open(pid)
        self.streams = {out_fd: bytearray(), err_fd: bytearray()}
        self.out_fd, self.err_fd = out_fd, err_fd
        self.started = time.monotonic()
        self.deadline = self.started + wall_s
        self.timed_out = self.overflowed = False


class ForkServer:
    def __init__(self, control: socket.socket, max_parallel: int, granted: dict, workdir_root: str | None):
        self._control = control
        self._workdir_root = workdir_root
        self._max_parallel = max_parallel
        self._granted = granted
        self._selector = selectors.EpollSelector()
        self._selector.register(control, selectors.EVENT_READ, self._on_control)
        self._pending: collections.deque = collections.deque()
        self._runs: dict[int, _Run] = {}  # by child pid
        self._free_uids = collections.deque(isolation.uid_pool())
        self._uid_killer = isolation.UidKiller() if granted["drop_uid"] else None

    def serve(self) -> None:
        while self._control is not None:
            now = time.monotonic()
            deadline = min((run.deadline for run in self._runs.values() if not run.timed_out), default=None)
            timeout = None if deadline is None else max(0.0, deadline - now)
            for key, _ in self._selector.select(timeout):
                # An earlier callback of this batch may have closed the fd (and a new run may reuse
                # its number): dispatch only keys still registered.
                if self._selector.get_map().get(key.fd) is key:
                    key.data(key.fileobj)
            self._enforce_wall_limits()
        self._pending.clear()
        for run in list(self._runs.values()):
            _kill_group(run.pid)
            self._finish(run)
        if self._uid_killer is not None:
            self._uid_killer.close()

    # --- callers -------------------------------------------------------------------------------

    def _on_control(self, control: socket.socket) -> None:
        try:
            msg, fds, _, _ = socket.recv_fds(control, 1, 1)
        except OSError:
            msg, fds = b"", []
        if not msg:  # the client process is gone or shutting down
            self._selector.unregister(control)
            control.close()
            self._control = None
            return
        for fd in fds:
            conn = socket.socket(fileno=fd)
            conn.settimeout(_PEER_TIMEOUT_S)
            self._selector.register(conn, selectors.EVENT_READ, self._on_request)

    def _on_request(self, conn: socket.socket) -> None:
        try:
            request = recv_frame(conn)
        except (OSError, EOFError, ValueError, TypeError):
            self._drop(conn)
            return
        if self._can_start():
            self._start(conn, request)
        else:
            self._pending.append((conn, request))

    def _drop(self, conn: socket.socket) -> None:
        self._selector.unregister(conn)
        conn.close()
        self._pending = collections.deque(item for item in self._pending if item[0] is not conn)
        for run in self._runs.values():
            if run.conn is conn:  # nobody waits for it any more
                _kill_group(run.pid)
                run.conn = None

    def _send(self, conn: socket.socket | None, reply: dict) -> None:
        if conn is None:
            return
        try:
            send_frame(conn, reply)
        except OSError:
            self._drop(conn)

    # --- runs ----------------------------------------------------------------------------------

    def _can_start(self) -> bool:
        return len(self._runs) < self._max_parallel and bool(self._free_uids)

    def _start(self, conn: socket.socket, request: dict) -> None:
        uid = self._free_uids.popleft()
        workdir = tempfile.mkdtemp(prefix="pettingllms-sandbox-", dir=self._workdir_root)
        stdin_fd = os.memfd_create("stdin")
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            if self._granted["drop_uid"]:
                os.chown(workdir, uid, uid)
            _write_all(stdin_fd, request["stdin"])
            os.lseek(stdin_fd, 0, os.SEEK_SET)
            server_pid = os.getpid()
            pid = os.fork()
        except OSError as exc:
            for fd in (stdin_fd, out_r, out_w, err_r, err_w):
                os.close(fd)
            shutil.rmtree(workdir, ignore_errors=True)
            self._free_uids.append(uid)
            self._send(conn, result("error", b"", f"sandbox: could not start the run: {exc}\n".encode(), None, 0.0))
            return
        if pid == 0:
            _run_child(request, stdin_fd, out_w, err_w, workdir, uid, self._granted, server_pid)
        run = _Run(conn, uid, workdir, pid, out_r, err_r, request["wall_s"], request["max_output_bytes"])
        for fd in (stdin_fd, out_w, err_w):
            os.close(fd)
        self._runs[pid] = run
        for fd in (out_r, err_r):
            os.set_blocking(fd, False)
            self._selector.register(fd, selectors.EVENT_READ, lambda fd, run=run: self._on_output(run, fd))
        self._selector.register(run.pidfd, selectors.EVENT_READ, lambda _, run=run: self._finish(run))

    def _on_output(self, run: _Run, fd: int) -> None:
        at_eof = not _read_available(run, fd)
        overflowed = len(run.streams[fd]) > run.max_output_bytes
        if at_eof or overflowed:
            self._selector.unregister(fd)
        if overflowed and not run.overflowed:
            run.overflowed = True
            _kill_group(run.pid)

    def _enforce_wall_limits(self) -> None:
        now = time.monotonic()
        for run in self._runs.values():
            if not run.timed_out and now >= run.deadline:
                run.timed_out = True
                _kill_group(run.pid)

    def _finish(self, run: _Run) -> None:
        # The child is a zombie until waitpid, so its pid (= process group id) cannot have been
        # reused yet: kill what is left of the group first, then reap.
        _kill_group(run.pid)
        status = os.waitpid(run.pid, 0)[1]
        wall_s = time.monotonic() - run.started
        uid_clean = self._uid_killer is None or self._uid_killer.kill_all(run.uid)
        if uid_clean:  # a uid with unkillable survivors is never handed out again
            self._free_uids.append(run.uid)
        self._selector.unregister(run.pidfd)
        os.close(run.pidfd)
        for fd in (run.out_fd, run.err_fd):
            if fd in self._selector.get_map():
                self._selector.unregister(fd)
            _read_available(run, fd)
            os.close(fd)
        shutil.rmtree(run.workdir, ignore_errors=True)
        del self._runs[run.pid]
        if not self._runs and self._granted["pid_namespace"]:
            isolation.kill_orphans()

        cap = run.max_output_bytes
        stdout, stderr = run.streams[run.out_fd], run.streams[run.err_fd]
        returncode = os.waitstatus_to_exitcode(status)
        if run.overflowed or len(stdout) > cap or len(stderr) > cap:
            outcome = "output_too_large"
        elif run.timed_out:
            outcome = "timeout"
        elif returncode < 0:
            outcome = "killed"
        else:
            outcome = "ok" if returncode == 0 else "error"
        self._send(run.conn, result(outcome, bytes(stdout[:cap]), bytes(stderr[:cap]), returncode, wall_s))
        while self._pending and self._can_start():
            self._start(*self._pending.popleft())


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _read_available(run: _Run, fd: int) -> bool:
    """Read what the pipe holds now, stopping once past the cap (a flood cannot keep the loop
    here); False at end of file."""
    buf = run.streams[fd]
    while len(buf) <= run.max_output_bytes:
        try:
            data = os.read(fd, _READ_CHUNK)
        except BlockingIOError:
            return True
        if not data:
            return False
        buf += data
    return True


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _run_child(
    request: dict, stdin_fd: int, out_w: int, err_w: int, workdir: str, uid: int, granted: dict, server_pid: int
):
    """In the forked child: lock down, then run the code as ``python -c`` would. Never returns."""
    try:
        os.setsid()  # own session and process group: the server kills the group as a whole
        os.dup2(stdin_fd, 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        os.closerange(3, resource.getrlimit(resource.RLIMIT_NOFILE)[1])  # control and other runs' fds
        os.chdir(workdir)
        os.environ["HOME"] = os.environ["TMPDIR"] = workdir  # the rest is _RUN_ENV, set at start
        memory = request["memory_mb"] * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        resource.setrlimit(resource.RLIMIT_FSIZE, (memory, memory))  # no file bigger than the memory budget
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        # Soft limit: SIGXCPU; hard limit one second later: SIGKILL, for code that catches SIGXCPU.
        resource.setrlimit(resource.RLIMIT_CPU, (request["cpu_s"], request["cpu_s"] + 1))
        os.nice(_NICENESS)
        if granted["drop_uid"]:
            resource.setrlimit(resource.RLIMIT_NPROC, (isolation.MAX_TASKS_PER_RUN, isolation.MAX_TASKS_PER_RUN))
            isolation.become(uid, granted["keep_read"])
        else:
            isolation.drop_capabilities()
        # Orphaned runs die with the server (set after become, which clears it), including
        # when the server died before this line.
        isolation.die_with_parent()
        if os.getppid() != server_pid:
            os._exit(_SETUP_FAILED_EXIT)
    except BaseException as exc:
        os.write(2, f"sandbox setup failed: {exc!r}\n".encode())
        os._exit(_SETUP_FAILED_EXIT)
    exit_code = 1
    try:
        exit_code = _exec_as_main(request["code"])
    finally:  # whatever happens, the child never returns into the server's code
        os._exit(exit_code & 0xFF)


_run_stdio: tuple = ()  # set by _prepare_runs


def _prepare_runs() -> None:
    """Server only (the client imports this module too): work done once here is work no run repeats."""
    global _run_stdio
    # Pre-imported: runs importing them pay nothing.
    import bisect, copy, decimal, fractions, functools, heapq, itertools, json, math  # noqa: E401,F401
    import operator, random, re, statistics, string, typing  # noqa: E401,F401

    compile("", "<string>", "exec")  # builds the ~100 AST types, lazily made by the first compile()

    # The run's standard streams, as `python -c` sets them up for pipes. They refer to fds 0-2
    # only, which each child points at its own input and pipes before using them. Installed here
    # so that no child pays for freeing the streams they replace.
    _run_stdio = (
        open(0, encoding="utf-8", errors="surrogateescape", closefd=False),
        open(1, "w", encoding="utf-8", errors="surrogateescape", closefd=False),
        open(2, "w", encoding="utf-8", errors="backslashreplace", buffering=1, closefd=False),
    )
    sys.stdin, sys.stdout, sys.stderr = sys.__stdin__, sys.__stdout__, sys.__stderr__ = _run_stdio
    os.environ.clear()  # the client passes none, but what the runs see is decided here
    os.environ.update(_RUN_ENV)


def _exec_as_main(code: str) -> int:
    sys.argv = ["-c"]
    sys.path.insert(0, "")  # the working directory, as for `python -c`
    main = types.ModuleType("__main__")
    sys.modules["__main__"] = main
    try:
        exec(compile(code, "<string>", "exec"), main.__dict__)
        exit_code = 0
    except SystemExit as exc:
        exit_code = _system_exit_code(exc)
    except BaseException as exc:
        # Skip this function's frame: the traceback starts in the run's code, as for `python -c`.
        tb = exc.__traceback__.tb_next if exc.__traceback__ is not None else None
        traceback.print_exception(type(exc), exc, tb)
        exit_code = 1
    for stream in _run_stdio[1:]:
        try:
            stream.flush()
        except (OSError, ValueError):  # reader gone (output cap) or stream closed by the code
            pass
    return exit_code


def _system_exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


def main(argv: list[str]) -> None:
    _prepare_runs()
    control = socket.socket(fileno=int(argv[1]))
    max_parallel = int(argv[2])
    user_namespace = isolation.enter_user_namespace()
    pid_namespace = user_namespace and isolation.become_pid_namespace_init()
    workdir_root = isolation.enter_private_filesystem()  # before the identity probe, which then reads inside it
    # Root of a user namespace has no other uid to give runs (only 0 is mapped there).
    drop_uid, keep_read = (False, False) if user_namespace else isolation.probe_identity(isolation.uid_pool()[0])
    granted = {
        "network": isolation.enter_private_network(),
        "filesystem": workdir_root is not None,
        "user_namespace": user_namespace,
        "pid_namespace": pid_namespace,
        "drop_uid": drop_uid,
        "keep_read": keep_read,
    }
    server = ForkServer(control, max_parallel, granted, workdir_root or _WORKDIR_ROOT)
    gc.freeze()  # children then share the server's objects instead of copying pages gc touches
    send_frame(control, granted)
    server.serve()

