"""Read a views page or payload back in Python, independently of the page's JavaScript."""

from __future__ import annotations

import base64
import json
import re
import zlib
from pathlib import Path
from typing import Any

import numpy as np

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts" / "views"  # screenshots (gitignored)
# resolves once the page has drawn every input sent so far: the views paint pan, zoom, scroll and hover in an animation
# frame, and an input Chromium aligns to the next frame runs before that frame's callbacks, its paint in the frame after
NEXT_FRAME = "() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))"
DATA_BLOCK = re.compile(r'<script type="application/json" id="attnscope-data">(.*?)</script>', re.S)


def page_payload(html: str) -> dict[str, Any]:
    """The payload a page carries, read back from its JSON block."""
    found = DATA_BLOCK.search(html)
    assert found, "the page has no attnscope-data block"
    data: dict[str, Any] = json.loads(found.group(1))
    return data


def unpack(encoding: str, text: str) -> bytes:
    raw = base64.b64decode(text)
    return zlib.decompress(raw) if encoding.endswith("+zlib") else raw


def decode_source(spec: dict[str, Any]) -> np.ndarray:
    """A payload source back to floats [layer, head, query, key]: code / 255 * scale of its matrix."""
    codes = np.frombuffer(unpack(spec["encoding"], spec["data"]), dtype=np.uint8).reshape(spec["shape"])
    scales = np.asarray(spec["scales"], dtype=np.float64).reshape(spec["shape"][:2])
    return codes / 255.0 * scales[:, :, None, None]


def decode_block(block: dict[str, Any], n: int) -> dict[str, np.ndarray]:
    """A neuron block back to its float32 q, k, v, context [token, d_head] and scores, weights [query, key]."""
    f = np.frombuffer(unpack(block["encoding"], block["data"]), dtype="<f4")
    d = block["d_head"]
    stages = block.get("stages", ["q", "k", "scores", "weights"])
    sizes = {s: (n, n) if s in ("scores", "weights") else (n, d) for s in stages}
    out, at = {}, 0
    for name, shape in sizes.items():
        count = shape[0] * shape[1]
        out[name] = f[at: at + count].reshape(shape)
        at += count
    assert at == f.size
    return out
