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
    ports = {rendezvous.pick_port(None, 32768, rng) for _ in range(20)}
    assert all(rendezvous.LOWEST <= port < 32768 for port in ports)
    assert len(ports) > 1  # a random place: two runs on one node do not start from the same port
    for port in ports:
        with socket.socket() as s:
            s.bind(("", port))


def test_a_bound_port_is_skipped_and_a_full_range_refused():
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(RuntimeError, match="no free port in master_port_range"):
            rendezvous.pick_port([port, port + 1], None, random.Random(0))
        assert rendezvous.pick_port(None, rendezvous.LOWEST, random.Random(0)) not in (None, port)  # no room below: the kernel's choice


def test_install_replaces_verls_port_choice_for_every_worker_group():
    from verl.single_controller.ray import base

    original = base.get_master_addr_port
    try:
        rendezvous.install()
        assert base.get_master_addr_port is rendezvous.master_addr_port
    finally:
        base.get_master_addr_port = original
