"""What isolates the fork server and its runs: namespaces, mounts, capabilities, uids.

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

import ctypes
import os
import resource
import select
import signal
import socket
import sys
import sysconfig
import tempfile
import time

_UID_POOL_SIZE = 256
MAX_TASKS_PER_RUN = 32  # RLIMIT_NPROC (processes + threads) of one run's uid
# Where the private root is assembled (a mount point only inside the server's mount namespace).
_PRIVATE_ROOT = os.path.join(tempfile.gettempdir(), "pettingllms-sandbox-root")
_SYSTEM_LIBRARIES = ("/lib", "/lib32", "/lib64", "/usr/lib", "/usr/lib32", "/usr/lib64", "/usr/local/lib", "/etc/ld.so.cache")
_DEVICES = ("/dev/null", "/dev/zero", "/dev/random", "/dev/urandom")


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


def become(uid: int, keep_read: bool) -> None:
    """Drop root for good: no way back, no setuid binaries, at most read-any-file."""
    _check(_prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    if keep_read:
        _check(_prctl(_PR_SET_KEEPCAPS, 1, 0, 0, 0), "prctl(KEEPCAPS)")
    os.setresuid(uid, uid, uid)
    if keep_read:
        _check(_capset(ctypes.byref(_CAP_HEADER), _READ_SEARCH_ONLY), "capset")


def drop_capabilities() -> None:
    """For runs that keep the server's uid (root of a user namespace, or root where no uid could be
    taken): no capability now, none from any later ``exec``."""
    for cap in range(_CAP_LAST + 1):
        _prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)  # EPERM (no CAP_SETPCAP: nothing to drop) or EINVAL: fine
    _check(_prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
    _check(_capset(ctypes.byref(_CAP_HEADER), _NO_CAPABILITIES), "capset")


def close_fds_except(keep_fd: int) -> None:
    max_fd = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    os.closerange(3, keep_fd)
    os.closerange(keep_fd + 1, max_fd)


def probe_identity(uid: int) -> tuple[bool, bool]:
    """(drop_uid, keep_read): can a child take `uid`, and does it then need read access kept?"""
    if os.geteuid() != 0:
        return False, False
    readable_exit, unreadable_exit = 0, 3
    import_dirs = [path for path in [sysconfig.get_paths()["stdlib"], *sys.path] if os.path.isdir(path)]
    pid = os.fork()
    if pid == 0:
        try:
            become(uid, keep_read=False)
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


def die_with_parent() -> None:
    """SIGKILL this process when its parent dies (``prctl(PR_SET_PDEATHSIG)``)."""
    _check(_prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PDEATHSIG)")


def enter_user_namespace() -> bool:
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


def become_pid_namespace_init() -> bool:
    """Go on as PID 1 of a new pid namespace: fork, the child continues as the server; the parent
    only waits and exits with it. If the parent is killed, the child and its runs die with it."""
    if _unshare(_CLONE_NEWPID) != 0:
        return False
    parent = os.pidfd_open(os.getpid())  # readable once the parent is gone
    pid = os.fork()
    if pid == 0:
        die_with_parent()
        if select.select([parent], [], [], 0)[0]:  # it died before the line above
            os._exit(1)
        os.close(parent)
        return True
    os.closerange(3, resource.getrlimit(resource.RLIMIT_NOFILE)[1])  # the control socket is the child's
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    os._exit(code if code >= 0 else 128 - code)


def kill_orphans() -> None:
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


def enter_private_network() -> bool:
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


def enter_private_filesystem() -> str | None:
    """Chroot into a fresh tmpfs holding only what runs need (see the module docstring). Returns
    the run directories' root inside it, or None where the OS refuses (nothing changes then)."""
    if os.geteuid() != 0 or _unshare(_CLONE_NEWNS) != 0:
        return None
    try:
        _mount(None, "/", None, _MS_REC | _MS_PRIVATE)  # nothing below propagates to the host
        os.makedirs(_PRIVATE_ROOT, exist_ok=True)
        _mount("tmpfs", _PRIVATE_ROOT, "tmpfs", _MS_NOSUID, "mode=755")
        # The runs' writable /tmp first: an interpreter or venv under /tmp is bound inside it below.
        os.makedirs(_PRIVATE_ROOT + "/tmp")
        _mount("tmpfs", _PRIVATE_ROOT + "/tmp", "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=1777")
        for path in _readable_trees() + [device for device in _DEVICES if os.path.exists(device)]:
            _bind_read_only(path, _PRIVATE_ROOT)
        for link in [*_SYSTEM_LIBRARIES, sys.prefix, sys.base_prefix]:
            if os.path.islink(link) and not os.path.lexists(_PRIVATE_ROOT + link):
                os.makedirs(os.path.dirname(_PRIVATE_ROOT + link), exist_ok=True)
                os.symlink(os.readlink(link), _PRIVATE_ROOT + link)
        # Read-only from here on: runs that keep the server's uid own the tmpfs, and must not leave
        # files in it for later runs.
        _mount(None, _PRIVATE_ROOT, None, _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID)
        os.chroot(_PRIVATE_ROOT)
        os.chdir("/")
    except OSError as exc:
        print(f"sandbox: no filesystem isolation ({exc})", file=sys.stderr)
        return None
    return "/tmp"


class UidKiller:
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
                close_fds_except(theirs.fileno())
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


def uid_pool() -> range:
    """Uids no account uses, disjoint between servers alive at once (keyed by server pid)."""
    base = 0x40000000 + (os.getpid() % (1 << 22)) * _UID_POOL_SIZE
    return range(base, base + _UID_POOL_SIZE)
