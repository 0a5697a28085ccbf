"""verl platform ``cpu``: lets verl's trainer, FSDP2 engine and Ray placement run without an accelerator.

verl 0.9.1 knows only accelerator platforms and falls back to ``nvidia`` when none is found. This
platform is registered last, so verl's own detection picks it only when no accelerator platform
is available (or when ``VERL_PLATFORM=cpu`` forces it).

Ray still schedules trainer workers on a resource named ``GPU`` because verl's resource checks
count only GPU/NPU: declare as many fake GPUs as trainer ranks (``ray_init.num_gpus``).
"""

from __future__ import annotations

import logging
import types
from contextlib import contextmanager
from typing import Any

import psutil
import torch
import torch.distributed

from verl.plugin.platform import PlatformBase, PlatformRegistry

logger = logging.getLogger(__name__)

PLATFORM_NAME = "cpu"


def _zero(*_args, **_kwargs) -> int:
    return 0


def _noop(*_args, **_kwargs) -> None:
    return None


def _mem_get_info(*_args, **_kwargs) -> tuple[int, int]:
    vm = psutil.virtual_memory()
    return vm.available, vm.total


def _build_device_module() -> types.ModuleType:
    """``torch.cpu`` plus the ``torch.cuda``-style memory/RNG calls verl makes on its device module."""
    module = types.ModuleType("pettingllms_verl_cpu_device")
    module.__dict__.update({name: getattr(torch.cpu, name) for name in dir(torch.cpu) if not name.startswith("_")})
    module.__dict__.update(
        is_available=lambda: True,
        empty_cache=_noop,
        ipc_collect=_noop,
        set_per_process_memory_fraction=_noop,
        reset_peak_memory_stats=_noop,
        memory_allocated=_zero,
        memory_reserved=_zero,
        max_memory_allocated=_zero,
        max_memory_reserved=_zero,
        mem_get_info=_mem_get_info,
        get_device_name=lambda *_a, **_k: "cpu",
        get_rng_state=lambda *_a, **_k: torch.get_rng_state(),
        set_rng_state=lambda state, *_a, **_k: torch.set_rng_state(state),
        manual_seed=torch.manual_seed,
        manual_seed_all=torch.manual_seed,
    )
    return module


_DEVICE_MODULE = _build_device_module()


def _dedupe_backend(backend: Any) -> Any:
    """verl builds ``"cpu:gloo,<device>:<backend>"``; with device ``cpu`` that names cpu twice, which
    torch rejects ("Duplicate device type cpu"). Collapse it to plain ``"gloo"``."""
    if isinstance(backend, str) and "," in backend:
        entries = {entry.strip() for entry in backend.split(",")}
        if entries == {"cpu:gloo"}:
            return "gloo"
    return backend


def _install_gloo_backend_fix() -> None:
    """Wrap ``torch.distributed.init_process_group`` once so verl's backend string is valid on CPU.

    verl has no registry hook for the backend string (utils/distributed.py formats it inline), so
    this one wrapper, active only when this platform is, is the least invasive fix.
    """
    original = torch.distributed.init_process_group
    if getattr(original, "_pettingllms_cpu", False):
        return

    def init_process_group(*args, **kwargs):
        if "backend" in kwargs:
            kwargs["backend"] = _dedupe_backend(kwargs["backend"])
        elif args:
            args = (_dedupe_backend(args[0]),) + args[1:]
        return original(*args, **kwargs)

    init_process_group._pettingllms_cpu = True
    torch.distributed.init_process_group = init_process_group


@PlatformRegistry.register(platform=PLATFORM_NAME)
class PlatformCPU(PlatformBase):
    """Host CPU as a verl platform (gloo collectives, no IPC, no profiler)."""

    def __init__(self) -> None:
        _install_gloo_backend_fix()

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> types.ModuleType:
        return _DEVICE_MODULE

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        # Reached only after every accelerator platform said no (this one registers last).
        logger.warning("pettingllms_verl: no accelerator found; using the embedded CPU platform (gloo, fp32).")
        return True

    def current_device(self) -> str:  # torch.device("cpu") takes no index worth keeping
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        # Ray exports the fake GPU ids here; nothing reads them on CPU.
        return "CUDA_VISIBLE_DEVICES"

    @contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None
