"""Files written whole: a reader, or a run killed mid-write, never sees half of one."""

from __future__ import annotations

import os


def write_whole(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` under a temporary name and rename it over ``path``."""
    tmp = f"{os.fspath(path)}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)
