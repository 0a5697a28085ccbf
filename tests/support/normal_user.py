"""Run a command as a normal user (uid/gid 65534, no capabilities), from a root test process.

    python tests/support/normal_user.py [--no-user-namespaces] -- COMMAND...

The interpreter may live under a directory a normal user cannot enter (pyenv under a 0700
/root): in a private mount namespace that directory is covered by a world-traversable tmpfs
holding only the interpreter and this repository, as on a machine where the user owns their
Python. With ``--no-user-namespaces`` the kernel refuses the user every new user namespace (its
``user.max_user_namespaces`` is 0 inside a user namespace made for the purpose), as on a machine
with unprivileged user namespaces disabled.
"""

import ctypes
import os
import subprocess
import sys

USER = 65534
_CLONE_NEWUSER, _CLONE_NEWNS = 0x10000000, 0x00020000
_libc = ctypes.CDLL(None, use_errno=True)


def _unshare(flags: int) -> None:
    if _libc.unshare(flags) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"unshare: {os.strerror(errno)}")


def _enter_user_namespace_without_nesting() -> None:
    """Become root of a user namespace that maps every uid to itself and allows no nested one."""
    ready_r, ready_w = os.pipe()
    mapped_r, mapped_w = os.pipe()
    child = os.fork()
    if child == 0:
        _unshare(_CLONE_NEWUSER)
        os.write(ready_w, b"u")
        os.read(mapped_r, 1)
        with open("/proc/sys/user/max_user_namespaces", "w") as limit:
            limit.write("0")
        return
    os.read(ready_r, 1)
    for name in ("uid_map", "gid_map"):
        with open(f"/proc/{child}/{name}", "w") as mapping:
            mapping.write("0 0 65536")
    os.write(mapped_w, b"m")
    os._exit(os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]) & 0xFF)


def _not_traversable_ancestor(path: str) -> str | None:
    """The topmost directory above ``path`` that others may not enter, or None."""
    found, parent = None, os.path.dirname(path)
    while parent != os.path.dirname(parent):
        if not os.stat(parent).st_mode & 0o001:
            found = parent
        parent = os.path.dirname(parent)
    return found


def _expose(paths: list[str]) -> None:
    """In this (private) mount namespace, make each path reachable by a normal user. All are set
    aside before any directory is covered: two of them may sit under the same hidden one."""
    moves = []
    for index, path in enumerate(paths):
        hidden = _not_traversable_ancestor(path)
        if hidden is not None:
            stash = f"/tmp/normal-user-stash-{os.getpid()}-{index}"
            os.makedirs(stash)
            subprocess.run(["mount", "--bind", path, stash], check=True)
            moves.append((hidden, stash, path))
    for hidden in dict.fromkeys(hidden for hidden, _, _ in moves):
        subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=755", "tmpfs", hidden], check=True)
    for _, stash, path in moves:
        os.makedirs(path, exist_ok=True)
        subprocess.run(["mount", "--move", stash, path], check=True)
        os.rmdir(stash)


def main(argv: list[str]) -> None:
    no_user_namespaces = argv[0] == "--no-user-namespaces"
    command = argv[argv.index("--") + 1 :]
    if os.geteuid() != 0:
        sys.exit("normal_user.py needs root")
    if no_user_namespaces:
        _enter_user_namespace_without_nesting()
    _unshare(_CLONE_NEWNS)
    subprocess.run(["mount", "--make-rprivate", "/"], check=True)
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/support/ -> the repository
    _expose([os.path.realpath(sys.base_prefix), repo])
    os.execvp(
        "setpriv",
        ["setpriv", f"--reuid={USER}", f"--regid={USER}", "--clear-groups", "--inh-caps=-all", "--bounding-set=-all", *command],
    )


if __name__ == "__main__":
    main(sys.argv[1:])
