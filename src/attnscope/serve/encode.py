"""Arrays and bodies as a response carries them: a trace's stage (derived ones computed on request), an array
with its axes as base64 or lists, strict JSON. Shared by the one-pass and the encoder-decoder endpoints."""

from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np

from attnscope.errors import AttnscopeError
from attnscope.records.trace import Trace


def stage_array(tr: Trace, stage: str) -> np.ndarray:
    """A stage's array; rollout, flow and norms are computed on request where installed."""
    if stage in tr.arrays:
        return tr.arrays[stage]
    try:
        if stage == "rollout":
            return tr.rollout()
        if stage == "flow":
            return tr.flow()
        if stage in ("norm_head", "norm_layer"):
            return tr.norms()[stage]
    except ImportError as exc:
        raise AttnscopeError(f"stage {stage!r} is not available in this installation of attnscope") from exc
    raise AttnscopeError(f"this trace has no {stage!r} array ({tr.model.get('architecture')}): "
                         f"ask for {', '.join(tr.arrays)}")


def encode_array(a: np.ndarray, axes: tuple[str, ...], encoding: str) -> dict[str, Any]:
    """One array with its axes: base64 of little-endian float32 (C order), or nested lists."""
    f32 = np.ascontiguousarray(a, dtype="<f4")
    data: Any = base64.b64encode(f32.tobytes()).decode("ascii") if encoding == "base64" else f32.tolist()
    return {"axes": list(axes), "shape": list(f32.shape), "dtype": "float32", "encoding": encoding,
            "data": data}


def to_json(body: Any) -> bytes:
    """Strict JSON: a NaN or infinity from the model is a server error, never hidden."""
    try:
        text = json.dumps(body, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except ValueError as exc:
        raise ArithmeticError(f"the model produced NaN or infinite numbers; cannot send them as JSON: {exc}") from exc
    return text.encode("utf-8")
