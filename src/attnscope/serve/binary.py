"""The binary form of `POST /api/trace` (torch-free): arrays as raw little-endian float32, negotiated by Accept.

A client that sends `Accept: application/x-attnscope-arrays` gets one body:

    bytes 0-7    b"ATNSARR1"                     the format and its version
    bytes 8-11   uint32, little-endian: H        the header's length in bytes
    bytes 12-15  zero
    16 .. 16+H   the JSON body (UTF-8, padded with spaces to a multiple of 8 bytes), whose "arrays"
                 entries carry axes, shape, dtype "float32", encoding "binary", offset and nbytes
                 instead of "data"
    16+H ..      the buffer: each array in C order at its offset (from the buffer's start, a multiple of 8)

Every float32 arrives bit for bit (no text in between), and a browser reads an array without a copy:
`new Float32Array(body, 16 + H + offset, nbytes / 4)`. Clients that do not ask get JSON, as before.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np

MEDIA_TYPE = "application/x-attnscope-arrays"
MAGIC = b"ATNSARR1"
PREFIX = 16  # magic, header length, padding
ALIGN = 8


def accepts(accept: str | None) -> bool:
    """Does this Accept header ask for the binary form (named, with a q above 0)?"""
    for part in (accept or "").split(","):
        kind, *params = (p.strip() for p in part.split(";"))
        if kind.lower() != MEDIA_TYPE:
            continue
        q = next((p.split("=", 1)[1] for p in params if p.replace(" ", "").lower().startswith("q=")), "1")
        try:
            return float(q) > 0
        except ValueError:
            return False
    return False


def _pad(n: int) -> int:
    return -n % ALIGN


def encode(body: dict[str, Any], arrays: dict[str, tuple[np.ndarray, tuple[str, ...]]]) -> bytes:
    """`body` (without "arrays") and named (array, axes) pairs -> one binary body."""
    parts: list[bytes] = []
    described: dict[str, Any] = {}
    at = 0
    for name, (a, axes) in arrays.items():
        data = np.ascontiguousarray(a, dtype="<f4").tobytes()
        described[name] = {"axes": list(axes), "shape": list(a.shape), "dtype": "float32", "encoding": "binary",
                           "offset": at, "nbytes": len(data)}
        parts += [data, b"\0" * _pad(len(data))]
        at += len(data) + _pad(len(data))
    header = json.dumps({**body, "arrays": described}, ensure_ascii=False, allow_nan=False,
                        separators=(",", ":")).encode("utf-8")
    header += b" " * _pad(len(header))
    return MAGIC + struct.pack("<II", len(header), 0) + header + b"".join(parts)


def decode(data: bytes) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """A binary body -> (its JSON header, each array as float32 with its shape); for Python clients and tests."""
    if data[:8] != MAGIC or len(data) < PREFIX:
        raise ValueError(f"not an {MEDIA_TYPE} body (it starts with {data[:8]!r})")
    (size,) = struct.unpack_from("<I", data, 8)
    header: dict[str, Any] = json.loads(data[PREFIX:PREFIX + size])
    start = PREFIX + size
    arrays = {}
    for name, spec in header["arrays"].items():
        chunk = data[start + spec["offset"]:start + spec["offset"] + spec["nbytes"]]
        arrays[name] = np.frombuffer(chunk, dtype="<f4").reshape(spec["shape"])
    return header, arrays
