"""The one reader and writer of attnscope's files (torch-free): named arrays plus JSON metadata.

`.safetensors` keeps the metadata as JSON under the key "attnscope"; `.npz` keeps it as a one-string array
`__meta__`, and token strings as string arrays (`tokens`, `cross.tokens`, ...). Every record kind (a trace, an
encoder-decoder trace, a generation) is written and read here; what its arrays and metadata hold is the
record's own business (records.trace, records.generation).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from attnscope.errors import AttnscopeError

FORMAT_VERSION = 1
META_KEY = "attnscope"
SUFFIXES = (".safetensors", ".npz")


def write(p: Path, arrays: dict[str, np.ndarray], meta: dict[str, Any], strings: dict[str, list[str]],
          what: str = "a trace") -> None:
    """Write arrays [any shape] and metadata; `strings` (token texts) go into `.npz` files only."""
    if p.suffix not in SUFFIXES:
        raise AttnscopeError(f"cannot save {what} as {p.name!r}: use a .safetensors or .npz file name")
    if not p.parent.is_dir():
        raise AttnscopeError(f"cannot write {p}: {p.parent} is not a directory (create it first)")
    text = json.dumps(meta)
    try:
        if p.suffix == ".safetensors":
            _write_safetensors(p, arrays, text)
        else:
            named = {k: np.asarray(v, dtype=np.str_) for k, v in strings.items()}
            np.savez_compressed(p, **arrays, **named, __meta__=np.asarray([text]))  # type: ignore[arg-type]
    except OSError as exc:
        raise AttnscopeError(f"cannot write {p}: {exc.strerror or exc}") from exc


def _write_safetensors(p: Path, arrays: dict[str, np.ndarray], text: str) -> None:
    from safetensors import SafetensorError
    from safetensors.numpy import save_file

    try:
        save_file(arrays, str(p), metadata={META_KEY: text})
    except SafetensorError as exc:  # its I/O errors are not OSErrors
        raise AttnscopeError(f"cannot write {p}: {exc}") from exc


def read(p: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """A saved file's arrays (token strings left out) and metadata, by its suffix; every failure one line."""
    try:
        if p.suffix == ".safetensors":
            return _read_safetensors(p)
        if p.suffix == ".npz":
            return _read_npz(p)
    except OSError as exc:
        raise AttnscopeError(f"cannot read {p}: {exc.strerror or exc}") from exc
    except (ValueError, KeyError) as exc:
        raise AttnscopeError(f"{p} is not an attnscope trace: {exc}") from exc
    raise AttnscopeError(f"cannot read a trace from {p.name!r}: use a .safetensors or .npz file")


def _read_safetensors(p: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(p), framework="numpy") as f:
            meta = json.loads((f.metadata() or {})[META_KEY])
            read = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (not a dict)
    except SafetensorError as exc:  # a damaged or foreign file; safetensors' error is no ValueError nor OSError
        raise ValueError(f"not a readable .safetensors file ({exc})") from exc
    return read, meta


def _read_npz(p: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    try:
        archive = np.load(p, allow_pickle=False)
    except ValueError as exc:  # numpy's own message would suggest allow_pickle=True: never for a file of unknown origin
        raise ValueError("not a .npz archive") from exc
    if not isinstance(archive, np.lib.npyio.NpzFile):  # a single .npy array
        raise ValueError("a single array, not a .npz archive")
    with archive as z:
        meta = json.loads(str(z["__meta__"][0]))
        read = {k: z[k] for k in z.files if k != "__meta__" and not k.endswith("tokens")}
    return read, meta
