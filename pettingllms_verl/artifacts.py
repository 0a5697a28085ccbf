"""Where the recipes find models, data and checkpoints (``pettingllms.paths.artifacts``), and which
``make`` target builds a missing one.

The recipes read ``$PETTINGLLMS_ARTIFACTS``. ``make`` sets it to the repository's ``artifacts/``; a
command typed outside ``make`` (``python -m verl.trainer.main_ppo ...``, ``pettingllms-eval``) in a
working directory that holds ``artifacts/`` gets that folder too (``use_working_directory``), so the
two agree. Elsewhere the recipes fall back to ``~/.cache/pettingllms_verl``.
"""

from __future__ import annotations

import os
import re

ENV = "PETTINGLLMS_ARTIFACTS"
KEY = "pettingllms.paths.artifacts"  # the recipes' key; base/pettingllms.yaml reads $PETTINGLLMS_ARTIFACTS into it
FOLDER = "artifacts"  # what make writes under the repository (its ARTIFACTS default)
FALLBACK = os.path.join("~", ".cache", "pettingllms_verl")  # the recipes' folder where neither is set (base/pettingllms.yaml)
_from_working_directory: str | None = None  # the folder use_working_directory chose in this process

# a path under the artifacts folder -> the make target that builds it (first match; {0}: the group, a
# model's env name as its target spells it, model-plan-path, a data set's as its recipe file, data-plan_path_6x6)
TARGETS = [
    (r"tiny_model/", "make model"),
    (r"tiny_vl_model_plan_path/", "make model-vl"),
    (r"tiny_model_plan_path_(?:team|demos)/", "make model-plan-path-demos"),
    (r"tiny_model_(\w+)/", "make model-{0}"),
    (r"smollm2_135m_\w+_adapter/", "make real-warm-start"),
    (r"smollm2_135m/", "make real-model"),
    (r"data/quickstart/", "make data"),
    (r"data/(\w+)/", "make data-{0}"),
]


def use_working_directory() -> str | None:
    """With ``$PETTINGLLMS_ARTIFACTS`` unset, point it at ``./artifacts`` when the working directory
    has one (in this process, and so in the Ray workers it starts); returns the folder, or None."""
    global _from_working_directory
    if os.environ.get(ENV) or not os.path.isdir(FOLDER):
        return None
    os.environ[ENV] = _from_working_directory = os.path.abspath(FOLDER)
    return _from_working_directory


def root() -> str:
    """The artifacts folder as the recipes find it: ``$PETTINGLLMS_ARTIFACTS``, else the working
    directory's ``artifacts/`` (``use_working_directory``), else ``~/.cache/pettingllms_verl``."""
    use_working_directory()
    return os.environ.get(ENV) or os.path.expanduser(FALLBACK)


def pin(config) -> str | None:
    """Write the resolved ``pettingllms.paths.artifacts`` into ``config``: the recipes interpolate
    ``$PETTINGLLMS_ARTIFACTS``, and a process on another Ray node has its node's environment, not
    this one's. Returns the folder (None without the key)."""
    from omegaconf import OmegaConf

    folder = OmegaConf.select(config, KEY)
    if folder is not None:
        OmegaConf.update(config, KEY, str(folder))
    return folder


def make_target(path: str) -> str | None:
    """The ``make`` target (run in the repository) that builds ``path``, a model folder or data file
    under the artifacts folder; None for a path make does not build."""
    root = os.environ.get(ENV)
    relative = os.path.relpath(os.path.abspath(os.path.expanduser(path)), root) if root else path
    relative = relative.replace(os.sep, "/").rstrip("/") + "/"
    for pattern, target in TARGETS:
        match = re.match(pattern, relative)
        if match:
            name = match.group(1) if match.groups() else ""
            return target.format(name if target.startswith("make data-") else name.replace("_", "-"))
    return None


def where() -> str:
    """How the artifacts folder was chosen, for messages about a missing file."""
    root = os.environ.get(ENV)
    if root and root == _from_working_directory:
        return f"the artifacts folder {root} (the working directory's, ${ENV} being unset)"
    if root:
        return f"the artifacts folder {root} (${ENV})"
    return (f"{FALLBACK} (${ENV} is unset and the working directory has no {FOLDER}/: run from the "
            f"repository, or export {ENV}=<folder>)")
