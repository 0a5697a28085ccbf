"""Sandboxed execution of model-written Python (hostile input).

``run_python(code, stdin, limits) -> SandboxResult`` runs the code as ``python -c`` would, in a
process forked from a pre-started fork server. Three rooms and a door: ``protocol`` (the wire
format), ``isolation`` (namespaces, mounts, capabilities, uids), ``server`` (the fork server's
event loop and the run child), and ``client`` (the caller side). Nothing model-written is ever compiled or executed in the
calling process.
"""

from pettingllms_verl.sandbox.client import SandboxLimits, SandboxResult, SandboxUnavailable, run_python

__all__ = ["SandboxLimits", "SandboxResult", "SandboxUnavailable", "run_python"]
