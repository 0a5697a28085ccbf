"""The CPU backend: verl's ``cpu`` platform (``platform.py``) and the cores a process may use."""

import os


def usable_cores() -> int:
    """The cores this process may run on (its affinity where the OS tells it, else all of them)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
