"""`POST /api/trace` on an encoder-decoder model (T5, BART, Marian): the source (`text`) and a target.

The target is fed to the decoder teacher-forced (null: the model generates it greedily); the answer holds
each kind of attention ("encoder", "decoder", "cross") with its tokens, key tokens (the source's, for
cross-attention), check and requested arrays, and the views' payload of all three when asked. A target for
a model with one kind of attention is refused (422, one line).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import numpy as np

from attnscope import families
from attnscope.errors import AttnscopeError
from attnscope.serve.api import TraceRequest
from attnscope.serve.encode import encode_array, stage_array, to_json
from attnscope.serve.pool import checkpoint
from attnscope.stages import ARRAY_AXES

if TYPE_CHECKING:
    from attnscope.models import Model
    from attnscope.records.trace import EncoderDecoderTrace
    from attnscope.serve.service import Service


def is_seq2seq(m: Model) -> bool:
    return families.is_encoder_decoder(m.model)


def validate_target(m: Model, req: TraceRequest) -> None:
    """One line for a target on a one-kind model, or options the encoder-decoder answer does not have."""
    if not is_seq2seq(m):
        raise AttnscopeError(f"target is for encoder-decoder models (T5, BART, Marian): {m.name} "
                             f"({m.architecture}) is not one, so leave target null", parameter="target")
    unsupported = [name for name, used in (("pair", req.pair is not None), ("sources", bool(req.sources)),
                                           ("maps", req.maps != "inline"), ("Accept: binary", req.binary)) if used]
    if unsupported:
        raise AttnscopeError(f"{', '.join(unsupported)}: not available for an encoder-decoder model's trace yet; "
                             "send text, target, stages, encoding and payload only")


def seq2seq_body(service: Service, req: TraceRequest, stop: threading.Event) -> bytes:
    """The three kinds' tokens, checks and arrays (JSON), and their payload when asked."""
    from attnscope.tracing.seq2seq import trace_seq2seq

    m = service.model(req.model)
    validate_target(m, req)
    n = service.max_length(m, req.max_length)
    with service.model_lock(m):
        checkpoint(stop)  # its client may have left while it waited for the model
        ed = trace_seq2seq(req.text, req.target, model=m, max_length=n, truncate=req.truncate)
    arrays = {kind: {s: stage_array(t, s) for s in req.stages} for kind, t in ed.kinds.items()}
    payload_json = _payload(ed) if req.payload else b""
    flat = {f"{kind}.{s}": a for kind, stages in arrays.items() for s, a in stages.items()}
    service.budget.validate(flat, req.encoding, len(payload_json))
    checkpoint(stop)
    body: dict[str, Any] = {
        "model": ed.model, "text": ed.source, "target": ed.target_text, "generated": ed.generated,
        "status": ed.status(), "kinds": {kind: _kind(t, arrays[kind], req.encoding) for kind, t in ed.kinds.items()},
    }
    out = to_json(body)
    return out[:-1] + b',"payload":' + payload_json + b"}" if req.payload else out


def _kind(t: Any, arrays: dict[str, np.ndarray], encoding: str) -> dict[str, Any]:

    return {"tokens": [x.to_dict() for x in t.tokens], "key_tokens": [x.to_dict() for x in t.keys],
            "truncated": t.truncated, "check": t.check().to_dict(),
            "arrays": {s: encode_array(a, ARRAY_AXES[s], encoding) for s, a in arrays.items()}}


def _payload(ed: EncoderDecoderTrace) -> bytes:
    from attnscope.views.kinds import family_payload

    return to_json(family_payload(ed.kinds, (ed.source, ed.target_text), neuron="none", attention="cross"))


__all__ = ["is_seq2seq", "seq2seq_body", "validate_target"]
