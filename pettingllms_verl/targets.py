"""Names of user code in a config: ``"package.module:attr"`` or ``"path/to/file.py:attr"``.

One loader for every such name (environments, per-role reward functions), so they read and fail
alike: a ``TargetError`` that says what could not be found and where.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import os
import sys
from typing import Any


class TargetError(ValueError):
    """A ``module:attr`` name that does not lead to an object."""


@functools.cache
def load_target(target: str) -> Any:
    """The object ``target`` names: ``module:attr`` (importable here) or ``file.py:attr``."""
    module_name, sep, attr = str(target).rpartition(":")
    if not sep or not module_name or not attr:
        raise TargetError(f"{target!r} is not 'package.module:name' or 'path/to/file.py:name'")
    if module_name.endswith(".py"):
        module = _module_from_file(module_name)
    else:
        try:
            module = importlib.import_module(module_name)
        except ImportError as error:
            raise TargetError(
                f"cannot import {module_name!r} for {target!r} ({error}); install the package that holds it "
                "(pip install -e <its folder>) in this environment, the one Ray's workers run in"
            ) from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise TargetError(f"{module_name!r} has no {attr!r} (for {target!r})") from None


def _module_from_file(path: str):
    full = os.path.abspath(os.path.expanduser(path))
    if not os.path.isfile(full):
        raise TargetError(f"file not found: {full}")
    name = f"_pettingllms_user_{hashlib.sha1(full.encode()).hexdigest()[:12]}"  # the same in every process
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, full)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before exec: dataclasses and pickling look the module up by name
    spec.loader.exec_module(module)
    return module
