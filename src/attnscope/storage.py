"""Save and load traces: `.safetensors` (metadata as JSON) or `.npz` (metadata as a JSON string array).

Arrays are named by stage (x, q, k, v, scores, weights, context, output) with the axes
of `attnscope.stages.ARRAY_AXES`, plus `input_ids` [token]; `.npz` also holds `tokens`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from attnscope import report
from attnscope.errors import AttnscopeError
from attnscope.stages import ARRAY_AXES
from attnscope.tokens import Token
from attnscope.traces import Trace

FORMAT_VERSION = 1
_META_KEY = "attnscope"


def _metadata(tr: Trace) -> dict[str, Any]:
    return {
        "format": FORMAT_VERSION,
        "model": tr.model,
        "text": tr.text,
        "pair": tr.pair,
        "tokens": [t.to_dict() for t in tr.tokens],
        "scaling": tr.scaling,
        "truncated": tr.truncated,
        "unsupported": tr.unsupported,
        "axes": {k: list(v) for k, v in ARRAY_AXES.items()},
        "check": tr.check().to_dict(),
    }


def save_trace(tr: Trace, path: str | os.PathLike[str]) -> None:
    p = Path(path)
    arrays = {k: np.ascontiguousarray(v) for k, v in tr.arrays.items()}
    arrays["input_ids"] = np.asarray([t.id for t in tr.tokens], dtype=np.int64)
    meta = json.dumps(_metadata(tr))
    if not p.parent.is_dir():
        raise AttnscopeError(f"cannot write {p}: {p.parent} is not a directory (create it first)")
    try:
        if p.suffix == ".safetensors":
            from safetensors import SafetensorError
            from safetensors.numpy import save_file

            try:
                save_file(arrays, str(p), metadata={_META_KEY: meta})
            except SafetensorError as exc:  # its I/O errors are not OSErrors
                raise AttnscopeError(f"cannot write {p}: {exc}") from exc
        elif p.suffix == ".npz":
            tokens = np.asarray([t.text for t in tr.tokens], dtype=np.str_)
            np.savez_compressed(p, **arrays, tokens=tokens, __meta__=np.asarray([meta]))  # type: ignore[arg-type]
        else:
            raise AttnscopeError(f"cannot save a trace as {p.name!r}: use a .safetensors or .npz file name")
    except OSError as exc:
        raise AttnscopeError(f"cannot write {p}: {exc.strerror or exc}") from exc


def load_trace(path: str | os.PathLike[str]) -> Trace:
    p = Path(path)
    try:
        if p.suffix == ".safetensors":
            arrays, meta = _read_safetensors(p)
        elif p.suffix == ".npz":
            arrays, meta = _read_npz(p)
        else:
            raise AttnscopeError(f"cannot read a trace from {p.name!r}: use a .safetensors or .npz file")
    except OSError as exc:
        raise AttnscopeError(f"cannot read {p}: {exc.strerror or exc}") from exc
    except (ValueError, KeyError) as exc:
        raise AttnscopeError(f"{p} is not an attnscope trace: {exc}") from exc
    return _trace_from(arrays, meta)


def _read_safetensors(p: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    from safetensors import safe_open

    with safe_open(str(p), framework="numpy") as f:
        meta = json.loads((f.metadata() or {})[_META_KEY])
        arrays = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open is not a dict)
    return arrays, meta


def _read_npz(p: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    with np.load(p, allow_pickle=False) as z:
        meta = json.loads(str(z["__meta__"][0]))
        arrays = {k: z[k] for k in z.files if k not in ("__meta__", "tokens")}
    return arrays, meta


def _trace_from(arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> Trace:
    tokens = [Token(**t) for t in meta["tokens"]]
    stages = {k: v for k, v in arrays.items() if k in ARRAY_AXES}
    tr = Trace(meta["model"], meta["text"], meta.get("pair"), tokens, stages, list(meta["scaling"]),
               bool(meta.get("truncated", False)), unsupported=meta.get("unsupported"))
    tr.saved_check = meta.get("check")
    if tr.saved_check is not None:
        report.report_from_dict(tr.saved_check)  # validate now, not when a view asks
    return tr
