"""Rank 0's torch.distributed port for a worker group, drawn where no outgoing connection lands.

verl picks it on rank 0's node by binding port 0 and letting the socket go; the workers bind it
seconds later, once their processes have started. Port 0 is a port of the kernel's ephemeral range,
the range every outgoing connection on the node (Ray's gRPC opens many) is also given, so now and
then one takes it first and rank 0 fails with EADDRINUSE. Here the port is a free one below that
range, at a random place in it, so that runs sharing a node do not pick the same one.
"""

from __future__ import annotations

import random
import socket

import ray

EPHEMERAL_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"
LOWEST = 20000  # Ray's worker processes take ports 10002-19999 unless told otherwise
TRIES = 64


def ephemeral_low(path: str = EPHEMERAL_RANGE) -> int | None:
    """The lowest port of this node's ephemeral range; None where the kernel does not say."""
    try:
        with open(path) as file:
            return int(file.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def free_port(candidates: range, rng: random.Random, tries: int | None = TRIES) -> int | None:
    """A port of ``candidates`` that binds now, ``tries`` of them (None: all) in random order; None if none does."""
    for port in rng.sample(candidates, len(candidates) if tries is None else min(tries, len(candidates))):
        with socket.socket() as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
            return port
    return None


def pick_port(master_port_range: list[int] | None, low: int | None, rng: random.Random) -> int:
    """A free port of ``master_port_range`` where given (verl's option), else one in
    [``LOWEST``, ``low``) below the ephemeral range starting at ``low``, else one the kernel picks."""
    if master_port_range is not None:
        port = free_port(range(*master_port_range), rng, tries=None)  # as verl does: every port of the range
        if port is None:
            raise RuntimeError(f"no free port in master_port_range {master_port_range}")
        return port
    port = free_port(range(LOWEST, low), rng) if low is not None else None
    if port is not None:
        return port
    with socket.socket() as s:  # no room below the ephemeral range: verl's own way
        s.bind(("", 0))
        return s.getsockname()[1]


@ray.remote
def master_addr_port(master_port_range: list[int] | None = None) -> tuple[str, str]:
    """verl's ``get_master_addr_port``, with the same arguments, run on rank 0's node."""
    return ray.util.get_node_ip_address().strip("[]"), str(pick_port(master_port_range, ephemeral_low(), random.Random()))


def install() -> None:
    """Every worker group this process creates from now on draws its port here."""
    from verl.single_controller.ray import base

    base.get_master_addr_port = master_addr_port
