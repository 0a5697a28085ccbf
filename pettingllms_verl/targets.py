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
    try:
        module = _module_from_file(module_name) if module_name.endswith(".py") else importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name is None or not (module_name == error.name or module_name.startswith(error.name + ".")):
            raise TargetError(f"importing {module_name!r} (for {target!r}) failed: {error!r}") from error
        raise TargetError(
            f"cannot import {module_name!r} for {target!r} ({error}); install the package that holds it "
            "(pip install -e <its folder>) in this environment, the one Ray's workers run in"
        ) from None
    except TargetError:
        raise
    except Exception as error:  # the user's module itself fails: a SyntaxError, an exception at import
        raise TargetError(f"importing {module_name!r} (for {target!r}) failed: {error!r}") from error
    try:
        return getattr(module, attr)
    except AttributeError:
        raise TargetError(f"{module_name!r} has no {attr!r} (for {target!r})") from None


def _module_from_file(path: str):
    # a relative path is read from each process's working directory (the driver's, each Ray worker's)
    full = os.path.abspath(os.path.expanduser(path))
    if not os.path.isfile(full):
        raise TargetError(f"file not found: {full} (give an absolute path: every Ray worker reads it)")
    name = f"_pettingllms_user_{hashlib.sha1(full.encode()).hexdigest()[:12]}"  # the same in every process
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, full)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before exec: dataclasses and pickling look the module up by name
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]  # no half-run module left for the next attempt
        raise
    return module
