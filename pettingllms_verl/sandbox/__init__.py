"""Sandboxed execution of model-written Python (hostile input).

``run_python(code, stdin, limits) -> SandboxResult`` runs the code as ``python -c`` would, in a
process forked from a pre-started fork server (see ``forkserver`` for the isolation it applies
and ``client`` for the caller side). Nothing model-written is ever compiled or executed in the
calling process.
"""

from pettingllms_verl.sandbox.client import SandboxLimits, SandboxResult, SandboxUnavailable, run_python

__all__ = ["SandboxLimits", "SandboxResult", "SandboxUnavailable", "run_python"]
