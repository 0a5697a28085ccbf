"""The plugin's seams into verl's vLLM servers (``pettingllms_verl/compat.py``): checked where vLLM is
installed, each target with the parameters the multi-LoRA servers rely on."""

from pettingllms_verl import compat


def test_every_seam_holds_with_vllm_installed():
    assert compat.installed("vllm") is not None
    assert compat.check(with_vllm=True) == []
    assert compat.outside_verified() == {}
