"""Save and load traces: `.safetensors` (metadata as JSON) or `.npz` (metadata as a JSON string array).

Arrays are named by stage (x, q, k, v, scores, weights, context, output) with the axes
of `attnscope.stages.ARRAY_AXES`, plus `input_ids` [token]; `.npz` also holds `tokens`.
An encoder-decoder trace keeps its three kinds apart by prefix: `encoder.weights`, `decoder.input_ids`,
`cross.memory`, ... (`.npz`: `cross.tokens` too), its metadata one entry per kind under "kinds".
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from attnscope.errors import AttnscopeError
from attnscope.records import check_report as report
from attnscope.records.trace import EncoderDecoderTrace, Trace
from attnscope.stages import ARRAY_AXES, ATTENTION_KINDS
from attnscope.tokens import Token

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
        **({} if tr.attention == "self" else {"attention": tr.attention}),
        **({} if tr.key_tokens is None else {"key_tokens": [t.to_dict() for t in tr.key_tokens]}),
    }


def _arrays(tr: Trace, prefix: str = "") -> dict[str, np.ndarray]:
    arrays = {prefix + k: np.ascontiguousarray(v) for k, v in tr.arrays.items()}
    arrays[prefix + "input_ids"] = np.asarray([t.id for t in tr.tokens], dtype=np.int64)
    return arrays


def save_trace(tr: Trace | EncoderDecoderTrace, path: str | os.PathLike[str]) -> None:
    """Write a trace, or an encoder-decoder trace (its kinds' arrays prefixed by kind: `cross.weights`)."""
    if isinstance(tr, EncoderDecoderTrace):
        arrays: dict[str, np.ndarray] = {}
        for kind, t in tr.kinds.items():
            arrays.update(_arrays(t, f"{kind}."))
        meta: dict[str, Any] = {"format": FORMAT_VERSION, "model": tr.model, "source": tr.source, "target": tr.target,
                                "kinds": {kind: _metadata(t) for kind, t in tr.kinds.items()}}
        tokens = {f"{kind}.tokens": [tok.text for tok in t.tokens] for kind, t in tr.kinds.items()}
    else:
        arrays, meta, tokens = _arrays(tr), _metadata(tr), {"tokens": tr.token_strings}
    _write(Path(path), arrays, json.dumps(meta), tokens)


def _write(p: Path, arrays: dict[str, np.ndarray], meta: str, tokens: dict[str, list[str]]) -> None:
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
            strings = {k: np.asarray(v, dtype=np.str_) for k, v in tokens.items()}
            np.savez_compressed(p, **arrays, **strings, __meta__=np.asarray([meta]))  # type: ignore[arg-type]
        else:
            raise AttnscopeError(f"cannot save a trace as {p.name!r}: use a .safetensors or .npz file name")
    except OSError as exc:
        raise AttnscopeError(f"cannot write {p}: {exc.strerror or exc}") from exc


def load_trace(path: str | os.PathLike[str]) -> Trace:
    """A saved Trace (an encoder-decoder file: one line saying to use load_encoder_decoder)."""
    return load_trace_and_metadata(path)[0]


def load_trace_and_metadata(path: str | os.PathLike[str]) -> tuple[Trace, dict[str, Any]]:
    """A saved Trace and its file's metadata (where a generation file keeps its steps:
    attnscope.records.generation), read once."""
    loaded, meta = _load(Path(path))
    if isinstance(loaded, EncoderDecoderTrace):
        raise AttnscopeError(f"{path} holds an encoder-decoder trace (encoder, decoder and cross-attention): load it "
                             "with attnscope.EncoderDecoderTrace.load")
    return loaded, meta


def load_encoder_decoder(path: str | os.PathLike[str]) -> EncoderDecoderTrace:
    """A saved EncoderDecoderTrace (a plain trace's file: one line saying so)."""
    loaded = load(path)
    if not isinstance(loaded, EncoderDecoderTrace):
        raise AttnscopeError(f"{path} holds a trace of one kind of attention, not an encoder-decoder trace: load it "
                             "with attnscope.Trace.load")
    return loaded


def load(path: str | os.PathLike[str]) -> Trace | EncoderDecoderTrace:
    """Whichever the file holds: a Trace, or an EncoderDecoderTrace."""
    return _load(Path(path))[0]


def _load(p: Path) -> tuple[Trace | EncoderDecoderTrace, dict[str, Any]]:
    """What the file holds, and its metadata."""
    arrays, meta = _read(p)
    try:
        loaded = _encoder_decoder_from(arrays, meta) if "kinds" in meta else _trace_from(arrays, meta)
    except (ValueError, KeyError, TypeError) as exc:
        raise AttnscopeError(f"{p} is not an attnscope trace: {type(exc).__name__} {exc}") from exc
    return loaded, meta


def _encoder_decoder_from(arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> EncoderDecoderTrace:
    kinds = []
    for kind in ATTENTION_KINDS:
        prefix = f"{kind}."
        own = {k.removeprefix(prefix): v for k, v in arrays.items() if k.startswith(prefix)}
        kinds.append(_trace_from(own, meta["kinds"][kind]))
    return EncoderDecoderTrace(meta["model"], meta["source"], meta.get("target"), *kinds)


def _read(p: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """A saved file's arrays and metadata, by its suffix; every failure one line."""
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
            meta = json.loads((f.metadata() or {})[_META_KEY])
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


def _trace_from(arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> Trace:
    tokens = [Token(**t) for t in meta["tokens"]]
    stages = {k: v for k, v in arrays.items() if k in ARRAY_AXES}
    keys = [Token(**t) for t in meta["key_tokens"]] if meta.get("key_tokens") is not None else None
    tr = Trace(meta["model"], meta["text"], meta.get("pair"), tokens, stages, list(meta["scaling"]),
               bool(meta.get("truncated", False)), unsupported=meta.get("unsupported"),
               attention=str(meta.get("attention", "self")), key_tokens=keys)
    tr.saved_check = meta.get("check")
    if tr.saved_check is not None:
        report.report_from_dict(tr.saved_check)  # validate now, not when a view asks
    return tr
