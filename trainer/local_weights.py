"""`--model local[/<name>]`: a packaged GGUF model as a trainable transformers folder.

The harness assembles and hash-checks the GGUF (`envforge.harness.assemble`); training needs
full-precision weights, so the GGUF is dequantized once into an HF folder beside it, named by the
GGUF's sha256 (`<cache>/hf/<sha256>/`): a second run, or a different model name for the same bytes,
reuses it, and bytes that changed can never be served from a folder made from the old ones. The
folder is written under a temporary name and renamed when complete, so a run killed halfway leaves
nothing that looks finished.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from envforge.harness import LocalModelError, assemble, is_local_spec, model_for_spec

MARKER = "dequantized.ok"


def resolve_model(spec: str | Path) -> Path:
    """A model folder for `spec`: a local spec becomes the dequantized packaged model; anything
    else is taken as a folder. Raises `LocalModelError` (one line) for an unknown local name or
    missing packages, `FileNotFoundError` for a folder that does not exist."""
    text = str(spec)
    if is_local_spec(text):
        return dequantized(text)
    path = Path(text)
    if not path.is_dir():
        raise FileNotFoundError(f"--model {text}: no such model folder (or use local, local/<name>)")
    return path


def dequantized(spec: str) -> Path:
    """The HF folder of the packaged model `spec`, made on first use."""
    model = model_for_spec(spec)
    gguf = assemble(model)
    target = gguf.parent / "hf" / model.sha256
    if (target / MARKER).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{model.name}.", dir=target.parent))
    try:
        _dequantize(gguf, tmp)
        (tmp / MARKER).write_text(f"{model.name} {model.sha256}\n")
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def _dequantize(gguf: Path, out: Path) -> None:
    """transformers reads the GGUF (through the `gguf` package) into float32 tensors; the model
    still carries the GGUF quantization marker, which `save_pretrained` refuses, so it is dropped
    before saving: the tensors themselves are plain float32 by then."""
    from importlib.util import find_spec

    if find_spec("gguf") is None:  # transformers needs it; a clear message beats its traceback
        raise LocalModelError("reading a GGUF needs the gguf package: pip install -e '.[train]'") from None
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
