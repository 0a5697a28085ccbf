"""Fork server: runs model-written Python in forked, locked-down children.

Started by the client as ``python -I forkserver.py CONTROL_FD MAX_PARALLEL`` with an empty
environment, so it holds none of the trainer's state or secrets. It imports the stdlib only
(the client imports this module for the wire helpers, so keep it free of package imports).

One single-threaded event loop (forking from a threaded process is unsafe) serves every caller:
- the control socket receives one connected socket per client connection (fd passing, so no
  listening socket exists that sandboxed code could reach);
- a connection carries one request at a time; the reply is a dict (see ``_result``);
- each run is a forked child: new session, fresh temp dir, cleared env, rlimits, nice, its own
  uid, then ``exec`` of the code. The loop enforces the wall limit and the output cap, and after
  every run kills its process group and every process left with the run's uid.

Isolation set up once, at start (each is skipped, and reported in the hello frame, where the OS
refuses; the client refuses to run code without network and filesystem isolation unless the user
opts in, see ``client``):
- ``user_namespace``: without root, the server first becomes root of a new user namespace (the
  caller's uid mapped to 0). That grants nothing outside it, but permits the mount, network and
  pid namespaces below for a normal user.
- ``pid_namespace`` (without root): the server goes on as PID 1 of a new pid namespace that holds
  only it and its runs. Runs cannot see or signal the trainer or the server; processes a run left
  behind, ``setsid`` included, are re-parented to the server and killed (``kill(-1)``) whenever
  no run is in flight; and when the server dies the kernel kills every process in it.
- ``network``: the server enters a new network namespace, inherited by every child: only a
  loopback interface that is down, so every connect fails. One namespace per server, not per
  run: creating and tearing down a namespace per run would cost more than the run.
- ``drop_uid`` (root): each run gets its own unprivileged uid from a per-server pool, so it cannot
  signal the trainer or other runs, write root-owned files, or escape ``kill_all`` by calling
  ``setsid``; RLIMIT_NPROC then bounds fork bombs per run.
- ``filesystem``: the server enters a new mount namespace and chroots into a read-only tmpfs that
  holds only read-only bind mounts of the interpreter's trees (prefixes, stdlib, site-packages),
  the system's shared libraries, four harmless devices and the runs' own writable ``/tmp`` (no
  ``/proc``, no ``/etc``). Datasets, checkpoints, home directories and credentials are not there
  to read. Parent directories on the tmpfs are world-traversable, so an interpreter under a 0700
  /root is importable without privilege.
- ``keep_read``: set when an unprivileged uid still cannot read the interpreter's files (no
  ``filesystem`` isolation and Python under a 0700 /root); the run then keeps
  CAP_DAC_READ_SEARCH (read any file, never write) so that ``import`` works.
Every run without its own uid drops all capabilities (bounding set included) before it starts.

Without root, runs share one uid: while in flight they can signal each other and read each
other's run directories (not the host's). Where the kernel refuses user namespaces as well, runs
share the caller's uid, network and filesystem; they are still limited, niced, and their process
group is killed, but a process that leaves the group (``setsid``) is not found afterwards. Linux
only (fork, pidfd, memfd).
"""

import collections
import ctypes
import gc
import marshal
import os
import resource
import select
import selectors
import shutil
import signal
import socket
import struct
import sys
import sysconfig
import tempfile
import time
import traceback
import types

_FRAME_HEADER = struct.Struct("<I")
_READ_CHUNK = 65536
_NICENESS = 10  # runs yield the CPU to the trainer
_MAX_TASKS_PER_RUN = 32  # RLIMIT_NPROC (processes + threads) of one run's uid
_UID_POOL_SIZE = 256
_SETUP_FAILED_EXIT = 125
_PEER_TIMEOUT_S = 10.0  # a trusted peer that stalls mid-frame must not wedge the loop for longer

# Run directories on tmpfs: creating and removing one on a disk filesystem costs milliseconds.
_WORKDIR_ROOT = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None  # None: tempfile's default
# Where the private root is assembled (a mount point only inside the server's mount namespace).
_PRIVATE_ROOT = os.path.join(tempfile.gettempdir(), "pettingllms-sandbox-root")
_SYSTEM_LIBRARIES = ("/lib", "/lib32", "/lib64", "/usr/lib", "/usr/lib32", "/usr/lib64", "/usr/local/lib", "/etc/ld.so.cache")
_DEVICES = ("/dev/null", "/dev/zero", "/dev/random", "/dev/urandom")

_RUN_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}  # plus HOME and TMPDIR per run

_CLONE_NEWNET = 0x40000000
_CLONE_NEWNS = 0x00020000
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWPID = 0x20000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 32, 4096, 16384, 1 << 18
_PR_SET_KEEPCAPS = 8
_PR_SET_PDEATHSIG = 1
_PR_SET_NO_NEW_PRIVS = 38
_PR_CAPBSET_DROP = 24
_CAP_LAST = 63  # beyond the kernel's last capability, PR_CAPBSET_DROP fails with EINVAL (ignored)
_CAP_DAC_READ_SEARCH = 2
_LINUX_CAPABILITY_VERSION_3 = 0x20080522


def send_frame(sock: socket.socket, obj) -> None:
    body = marshal.dumps(obj)
    sock.sendall(_FRAME_HEADER.pack(len(body)) + body)


def recv_frame(sock: socket.socket):
    (length,) = _FRAME_HEADER.unpack(_recv_exact(sock, _FRAME_HEADER.size))
    return marshal.loads(_recv_exact(sock, length))


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    buf = bytearray(size)
    view = memoryview(buf)
    received = 0
    while received < size:
        n = sock.recv_into(view[received:])
        if n == 0:
            raise ConnectionError("sandbox peer closed the connection")
        received += n
    return bytes(buf)


# Everything a child needs is built here, before any fork: work done once in the server is work
# no run repeats (resolving C symbols, building ctypes structs, text streams).
_libc = ctypes.CDLL(None, use_errno=True)
_prctl, _capset, _unshare, _libc_mount = _libc.prctl, _libc.capset, _libc.unshare, _libc.mount
_libc_mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]


def _check(ret: int, what: str) -> None:
    if ret != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


_CAP_HEADER = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
_READ_SEARCH_ONLY = (_CapData * 2)(
    _CapData(1 << _CAP_DAC_READ_SEARCH, 1 << _CAP_DAC_READ_SEARCH, 0), _CapData(0, 0, 0)
)
_NO_CAPABILITIES = (_CapData * 2)(_CapData(0, 0, 0), _CapData(0, 0, 0))


def _become(uid: int, keep_read: bool) -> None:
    """Drop root for good: no way back, no setuid binaries, at most read-any-file."""
    _check(_prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    if keep_read:
        _check(_prctl(_PR_SET_KEEPCAPS, 1, 0, 0, 0), "prctl(KEEPCAPS)")
    os.setresuid(uid, uid, uid)
    if keep_read:
        _check(_capset(ctypes.byref(_CAP_HEADER), _READ_SEARCH_ONLY), "capset")


def _drop_capabilities() -> None:
    """For runs that keep the server's uid (root of a user namespace, or root where no uid could be
    taken): no capability now, none from any later ``exec``."""
    for cap in range(_CAP_LAST + 1):
        _prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)  # EPERM (no CAP_SETPCAP: nothing to drop) or EINVAL: fine
    _check(_prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
    _check(_capset(ctypes.byref(_CAP_HEADER), _NO_CAPABILITIES), "capset")


def _close_fds_except(keep_fd: int) -> None:
    max_fd = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    os.closerange(3, keep_fd)
    os.closerange(keep_fd + 1, max_fd)


def _probe_identity(uid: int) -> tuple[bool, bool]:
    """(drop_uid, keep_read): can a child take `uid`, and does it then need read access kept?"""
    if os.geteuid() != 0:
        return False, False
    readable_exit, unreadable_exit = 0, 3
    import_dirs = [path for path in [sysconfig.get_paths()["stdlib"], *sys.path] if os.path.isdir(path)]
    pid = os.fork()
    if pid == 0:
        try:
            _become(uid, keep_read=False)
            for path in import_dirs:
                os.listdir(path)
            os._exit(readable_exit)
        except PermissionError:
            os._exit(unreadable_exit)
        except BaseException:
            os._exit(1)
    status = os.waitpid(pid, 0)[1]
    code = os.waitstatus_to_exitcode(status)
    return code in (readable_exit, unreadable_exit), code == unreadable_exit


def _enter_user_namespace() -> bool:
    """Without root: become root of a new user namespace, the caller's uid and gid mapped to 0."""
    if os.geteuid() == 0:
        return False
    uid, gid = os.geteuid(), os.getegid()
    if _unshare(_CLONE_NEWUSER) != 0:
        return False
    try:
        for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"), ("gid_map", f"0 {gid} 1")):
            with open(f"/proc/self/{name}", "w") as file:
                file.write(text)
    except OSError as exc:  # unmapped, we hold no capability: the steps below are refused in turn
        print(f"sandbox: user namespace without an id map ({exc})", file=sys.stderr)
        return False
    return True


def _become_pid_namespace_init() -> bool:
    """Go on as PID 1 of a new pid namespace: fork, the child continues as the server; the parent
    only waits and exits with it. If the parent is killed, the child and its runs die with it."""
    if _unshare(_CLONE_NEWPID) != 0:
        return False
    parent = os.pidfd_open(os.getpid())  # readable once the parent is gone
    pid = os.fork()
    if pid == 0:
        _check(_prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PDEATHSIG)")
        if select.select([parent], [], [], 0)[0]:  # it died before the line above
            os._exit(1)
        os.close(parent)
        return True
    os.closerange(3, resource.getrlimit(resource.RLIMIT_NOFILE)[1])  # the control socket is the child's
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    os._exit(code if code >= 0 else 128 - code)


def _kill_orphans() -> None:
    """As PID 1 of the runs' pid namespace with no run in flight: every other process in it is
    something a run left behind. ``kill(-1)`` reaches them all (never the caller); reap them."""
    try:
        os.kill(-1, signal.SIGKILL)
    except ProcessLookupError:
        return  # nothing left behind: the common case costs one syscall
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                time.sleep(0.001)  # killed, not yet reaped by the kernel
        except ChildProcessError:
            return


def _enter_private_network() -> bool:
    return _unshare(_CLONE_NEWNET) == 0


def _readable_trees() -> list[str]:
    """What a run may read: the interpreter's trees and the shared libraries, symlinks resolved,
    nested paths folded into the outermost one."""
    paths = sysconfig.get_paths()
    wanted = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, *_SYSTEM_LIBRARIES]
    wanted += [paths[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")]
    real = {os.path.realpath(path) for path in wanted if os.path.exists(path)}
    return sorted(path for path in real if not any(path.startswith(other + os.sep) for other in real))


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    args = [None if text is None else os.fsencode(text) for text in (source, target, fstype)]
    _check(_libc_mount(*args, flags, None if data is None else data.encode()), f"mount {target}")


def _bind_read_only(source: str, root: str) -> None:
    """Bind ``source`` at the same path under ``root``, read-only; the symlinks on the way (e.g.
    /lib -> usr/lib) are made again under ``root``."""
    target = root + source
    if os.path.isdir(source):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        open(target, "a").close()
    _mount(source, target, None, _MS_BIND | _MS_REC)
    # Keep the flags the kernel may lock on the source (nosuid, nodev, noexec) and add read-only.
    kept = os.statvfs(source).f_flag & (_MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    _mount(None, target, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | kept)


def _enter_private_filesystem() -> str | None:
    """Chroot into a fresh tmpfs holding only what runs need (see the module docstring). Returns
    the run directories' root inside it, or None where the OS refuses (nothing changes then)."""
    if os.geteuid() != 0 or _unshare(_CLONE_NEWNS) != 0:
        return None
    try:
        _mount(None, "/", None, _MS_REC | _MS_PRIVATE)  # nothing below propagates to the host
        os.makedirs(_PRIVATE_ROOT, exist_ok=True)
        _mount("tmpfs", _PRIVATE_ROOT, "tmpfs", _MS_NOSUID, "mode=755")
        for path in _readable_trees() + [device for device in _DEVICES if os.path.exists(device)]:
            _bind_read_only(path, _PRIVATE_ROOT)
        for link in [*_SYSTEM_LIBRARIES, sys.prefix, sys.base_prefix]:
            if os.path.islink(link) and not os.path.lexists(_PRIVATE_ROOT + link):
                os.makedirs(os.path.dirname(_PRIVATE_ROOT + link), exist_ok=True)
                os.symlink(os.readlink(link), _PRIVATE_ROOT + link)
        os.makedirs(_PRIVATE_ROOT + "/tmp", exist_ok=True)
        _mount("tmpfs", _PRIVATE_ROOT + "/tmp", "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=1777")
        # Read-only from here on: runs that keep the server's uid own the tmpfs, and must not leave
        # files in it for later runs.
        _mount(None, _PRIVATE_ROOT, None, _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID)
        os.chroot(_PRIVATE_ROOT)
        os.chdir("/")
    except OSError as exc:
        print(f"sandbox: no filesystem isolation ({exc})", file=sys.stderr)
        return None
    return "/tmp"


class _UidKiller:
    """Root helper that SIGKILLs every process of one uid (``kill(-1)`` with that real uid).

    A separate process because the caller must briefly take the uid: a run's survivor could
    signal it then. If one stops or kills the helper, it is replaced; the server is never exposed.
    """

    _ATTEMPTS = 3

    def __init__(self):
        self._spawn()

    def _spawn(self) -> None:
        ours, theirs = socket.socketpair()
        pid = os.fork()
        if pid == 0:
            try:
                _close_fds_except(theirs.fileno())
                self._serve(theirs)
            finally:
                os._exit(1)
        theirs.close()
        ours.settimeout(1.0)
        self._pid, self._sock = pid, ours

    @staticmethod
    def _serve(sock: socket.socket) -> None:
        while True:
            request = sock.recv(4)
            if len(request) != 4:
                os._exit(0)
            uid = int.from_bytes(request, "little")
            # Real and effective uid = run uid, saved uid = 0 (to come back); no effective caps,
            # so kill(-1) reaches exactly the processes of that uid.
            os.setresuid(uid, uid, 0)
            try:
                os.kill(-1, signal.SIGKILL)
            except ProcessLookupError:
                pass
            os.setresuid(0, 0, 0)
            sock.sendall(b"k")

    def kill_all(self, uid: int) -> bool:
        for _ in range(self._ATTEMPTS):
            try:
                self._sock.sendall(uid.to_bytes(4, "little"))
                if self._sock.recv(1) == b"k":
                    return True
            except OSError:
                pass
            self._replace()
        return False

    def _replace(self) -> None:
        self._sock.close()
        try:
            os.kill(self._pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(self._pid, 0)
        self._spawn()

    def close(self) -> None:
        self._sock.close()
        os.waitpid(self._pid, 0)


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
    def __init__(self, control: socket.socket, max_parallel: int, isolation: dict, workdir_root: str | None):
        self._control = control
        self._workdir_root = workdir_root
        self._max_parallel = max_parallel
        self._isolation = isolation
        self._selector = selectors.EpollSelector()
        self._selector.register(control, selectors.EVENT_READ, self._on_control)
        self._pending: collections.deque = collections.deque()
        self._runs: dict[int, _Run] = {}  # by child pid
        self._free_uids = collections.deque(_uid_pool())
        self._uid_killer = _UidKiller() if isolation["drop_uid"] else None

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
            if self._isolation["drop_uid"]:
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
            self._send(conn, _result("error", b"", f"sandbox: could not start the run: {exc}\n".encode(), None, 0.0))
            return
        if pid == 0:
            _run_child(request, stdin_fd, out_w, err_w, workdir, uid, self._isolation, server_pid)
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
        if not self._runs and self._isolation["pid_namespace"]:
            _kill_orphans()

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
        self._send(run.conn, _result(outcome, bytes(stdout[:cap]), bytes(stderr[:cap]), returncode, wall_s))
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


def _uid_pool() -> range:
    """Uids no account uses, disjoint between servers alive at once (keyed by server pid)."""
    base = 0x40000000 + (os.getpid() % (1 << 22)) * _UID_POOL_SIZE
    return range(base, base + _UID_POOL_SIZE)


def _result(status: str, stdout: bytes, stderr: bytes, returncode, wall_s: float) -> dict:
    return {"status": status, "stdout": stdout, "stderr": stderr, "returncode": returncode, "wall_s": wall_s}


def _run_child(
    request: dict, stdin_fd: int, out_w: int, err_w: int, workdir: str, uid: int, isolation: dict, server_pid: int
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
        if isolation["drop_uid"]:
            resource.setrlimit(resource.RLIMIT_NPROC, (_MAX_TASKS_PER_RUN, _MAX_TASKS_PER_RUN))
            _become(uid, isolation["keep_read"])
        else:
            _drop_capabilities()
        # Orphaned runs die with the server (set after _become, which clears it), including
        # when the server died before this line.
        _check(_prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PDEATHSIG)")
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
    user_namespace = _enter_user_namespace()
    pid_namespace = user_namespace and _become_pid_namespace_init()
    workdir_root = _enter_private_filesystem()  # before the identity probe, which then reads inside it
    # Root of a user namespace has no other uid to give runs (only 0 is mapped there).
    drop_uid, keep_read = (False, False) if user_namespace else _probe_identity(_uid_pool()[0])
    isolation = {
        "network": _enter_private_network(),
        "filesystem": workdir_root is not None,
        "user_namespace": user_namespace,
        "pid_namespace": pid_namespace,
        "drop_uid": drop_uid,
        "keep_read": keep_read,
    }
    server = ForkServer(control, max_parallel, isolation, workdir_root or _WORKDIR_ROOT)
    gc.freeze()  # children then share the server's objects instead of copying pages gc touches
    send_frame(control, isolation)
    server.serve()


if __name__ == "__main__":
    main(sys.argv)
