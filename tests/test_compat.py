"""The plugin's seams into verl's internals (``pettingllms_verl/compat.py``): each target exists with
the parameters the plugin relies on, and a verl outside the verified versions is said plainly at
registration, naming each seam that moved."""

from pathlib import Path

import pytest

from pettingllms_verl import compat


def test_every_seam_into_verl_holds_on_the_installed_verl():
    assert compat.check(with_vllm=False) == []
    assert compat.outside_verified() == {}  # the suite runs on a verified verl
    for seam in compat.SEAMS:  # each says where it is used and why no public hook serves
        assert seam.used_in and seam.why and ":" in seam.target, seam
        name = seam.target.rsplit(":", 1)[-1].rsplit(".", 1)[-1]
        for room in seam.used_in.split(", "):  # and each room named uses it
            path = Path(compat.__file__).parent / room
            assert path.is_file() and name in path.read_text(), (seam, room)


def test_a_seam_that_moved_is_named_with_what_changed(monkeypatch):
    from verl.trainer.ppo.v1 import replay_buffer

    def sample(self, global_steps, partition, batch_size, shuffle):  # renamed and a new required parameter
        return None

    monkeypatch.setattr(replay_buffer.ReplayBuffer, "sample", sample)
    monkeypatch.delattr(replay_buffer.ReplayBuffer, "_wait_for_next_poll")
    problems = compat.check(with_vllm=False)
    assert len(problems) == 2
    assert problems[0].startswith("verl.trainer.ppo.v1.replay_buffer:ReplayBuffer.sample") and "no parameter partition_id" in problems[0]
    assert "now requires partition, shuffle" in problems[0] and "(used in trainer/mas_trainer.py)" in problems[0]
    assert problems[1].startswith("verl.trainer.ppo.v1.replay_buffer:ReplayBuffer._wait_for_next_poll is gone (AttributeError")


def test_outside_the_verified_versions_registration_names_the_version_the_range_and_each_seam_that_moved(monkeypatch):
    monkeypatch.setattr(compat, "installed", lambda package: {"verl": "0.11.0"}.get(package))
    assert compat.outside_verified() == {"verl": "0.11.0"}
    said = compat.check_versions()  # every seam still holds: a warning, not a stop
    assert "installed verl 0.11.0 (verified: >=0.9.1,<0.10)" in said and "every seam still matches" in said
    monkeypatch.setattr(compat, "check", lambda: ["verl.utils.fsdp_utils:_select_fsdp2_wrap_targets(model, layers, mesh): now requires mesh"])
    with pytest.raises(RuntimeError) as error:
        compat.check_versions()
    assert "installed verl 0.11.0 (verified: >=0.9.1,<0.10); 1 of the plugin's seams" in str(error.value)
    assert "_select_fsdp2_wrap_targets(model, layers, mesh): now requires mesh" in str(error.value)
    assert "pip install 'verl>=0.9.1,<0.10'" in str(error.value)


def test_the_verified_range_is_the_one_the_package_requires():
    from importlib import metadata

    from packaging.requirements import Requirement

    (verl,) = [r for r in map(Requirement, metadata.requires("pettingllms-verl")) if r.name == "verl" and r.marker is None]
    low, high = compat.VERIFIED["verl"]
    assert {str(s) for s in verl.specifier} == {f">={low}", f"<{high}"}
