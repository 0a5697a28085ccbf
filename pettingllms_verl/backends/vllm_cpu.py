"""vLLM's CPU build as verl's rollout engine: weights that a trainer can sync in place.

On CPU, vLLM hands each linear layer's weight to a oneDNN (or sgl/zentorch) kernel after loading
and replaces the parameter with an empty tensor (``dispatch_cpu_unquantized_gemm``,
``remove_weight=True``). verl's weight sync then has nothing to load into ("Attempted to load
weight (torch.Size([128, 128])) into parameter (torch.Size([0]))"). Kept, the weight takes the
synced values in place and verl's ``process_weights_after_loading`` after the last bucket builds
the kernel again from them: the price is a second copy of the linear weights in host memory.

Registered as a vLLM general plugin (``vllm.general_plugins`` entry point), which vLLM runs in
each of its processes before the model is built; it acts only on the CPU platform and only in a
server verl started (``VERL_REPLICA_RANK`` is set there), so other uses of vLLM are untouched.
"""

from __future__ import annotations

import os

_PATCHED = "_pettingllms_keeps_weight"


def keep_linear_weights() -> None:
    """The plugin: make vLLM's CPU linear layers keep their weight parameter (idempotent)."""
    if "VERL_REPLICA_RANK" not in os.environ:
        return
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    from vllm.model_executor.layers import utils

    original = utils.dispatch_cpu_unquantized_gemm
    if getattr(original, _PATCHED, False):
        return

    def dispatch_cpu_unquantized_gemm(layer, remove_weight: bool) -> None:
        original(layer, remove_weight=False)

    setattr(dispatch_cpu_unquantized_gemm, _PATCHED, True)
    utils.dispatch_cpu_unquantized_gemm = dispatch_cpu_unquantized_gemm
