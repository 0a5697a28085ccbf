"""Rank 0's torch.distributed port: drawn below the kernel's ephemeral range, never a bound one."""

import random
import socket

import pytest

from pettingllms_verl.trainer import rendezvous


def test_the_ephemeral_range_is_read_from_the_kernels_file(tmp_path):
    good, bad = tmp_path / "good", tmp_path / "bad"
    good.write_text("32768\t60999\n")
    bad.write_text("")
    assert rendezvous.ephemeral_low(str(good)) == 32768
    assert rendezvous.ephemeral_low(str(bad)) is None
    assert rendezvous.ephemeral_low(str(tmp_path / "missing")) is None


def test_a_port_below_the_ephemeral_range_that_binds():
    rng = random.Random(0)
    ports = set()
    for _ in range(20):
        port = rendezvous.pick_port(None, 32768, rng)
        assert rendezvous.LOWEST <= port < 32768
        with socket.socket() as s:
            s.bind(("", port))  # free when picked
        ports.add(port)
    assert len(ports) > 1  # a random place: two runs on one node do not start from the same port


def test_a_bound_port_is_skipped_and_a_full_range_refused():
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(RuntimeError, match="no free port in master_port_range"):
            rendezvous.pick_port([port, port + 1], None, random.Random(0))
        assert rendezvous.pick_port(None, rendezvous.LOWEST, random.Random(0)) not in (None, port)  # no room below: the kernel's choice


def test_install_replaces_verls_port_choice_for_every_worker_group():
    import inspect

    from verl.single_controller.ray import base

    original = base.get_master_addr_port
    # a worker group looks the function up by this name in verl's module, and calls it with its arguments
    assert "get_master_addr_port" in base.RayWorkerGroup._get_master_addr_port.__code__.co_names
    assert inspect.signature(rendezvous.master_addr_port._function).parameters.keys() == inspect.signature(original._function).parameters.keys()
    try:
        rendezvous.install()
        assert base.get_master_addr_port is rendezvous.master_addr_port
    finally:
        base.get_master_addr_port = original


def test_a_range_given_is_searched_whole():
    """verl's master_port_range: every port of it is tried (as verl scans it), not a sample of them."""
    candidates = range(rendezvous.LOWEST + 5000, rendezvous.LOWEST + 5200)
    held = []
    try:
        for port in candidates:  # every port that binds is held, then one let go: the only free one
            s = socket.socket()
            try:
                s.bind(("", port))
                held.append(s)
            except OSError:
                s.close()
        last = held.pop()
        free = last.getsockname()[1]
        last.close()
        assert rendezvous.pick_port([candidates.start, candidates.stop], None, random.Random(0)) == free
    finally:
        for s in held:
            s.close()
