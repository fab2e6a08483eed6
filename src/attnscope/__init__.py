"""attnscope: open up the self-attention inside real transformer models.

    >>> import attnscope
    >>> tr = attnscope.trace("time flies like an arrow")   # the bundled all-MiniLM-L6-v2
    >>> tr.check().ok
    True

Names are imported on first use, so `import attnscope` (and the CLI's --help) stays fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from attnscope import _lazy, _moved

__version__ = "0.1.0"
_moved.install()  # old module paths (attnscope.traces, attnscope.report, ...) load the moved modules

_EXPORTS = {
    "TOLERANCE": "attnscope.records.check_report",
    "CheckReport": "attnscope.records.check_report",
    "AttnscopeError": "attnscope.errors",
    "DEFAULT_MODEL": "attnscope.models",
    "Model": "attnscope.models",
    "load_model": "attnscope.models",
    "Token": "attnscope.tokens",
    "Trace": "attnscope.records.trace",
    "trace": "attnscope.tracing.one_pass",
    "trace_seq2seq": "attnscope.tracing.seq2seq",
    "generate_seq2seq": "attnscope.tracing.seq2seq_decoding",
    "Seq2SeqGeneration": "attnscope.records.translation",
    "EncoderDecoderTrace": "attnscope.records.trace",
    "generate": "attnscope.tracing.decoding",
    "GenerationTrace": "attnscope.records.generation",
    "walkthrough": "attnscope.explain.from_trace",
    "attribute": "attnscope.attribution.api",
    "Attribution": "attnscope.attribution.record",
    "Walkthrough": "attnscope.explain.from_trace",
}

__all__ = [
    "DEFAULT_MODEL",
    "TOLERANCE",
    "AttnscopeError",
    "Attribution",
    "CheckReport",
    "EncoderDecoderTrace",
    "GenerationTrace",
    "Model",
    "Seq2SeqGeneration",
    "Token",
    "Trace",
    "Walkthrough",
    "attribute",
    "generate",
    "generate_seq2seq",
    "load_model",
    "trace",
    "trace_seq2seq",
    "walkthrough",
]

if TYPE_CHECKING:
    from attnscope.attribution.api import attribute
    from attnscope.attribution.record import Attribution
    from attnscope.errors import AttnscopeError
    from attnscope.explain.from_trace import Walkthrough, walkthrough
    from attnscope.models import DEFAULT_MODEL, Model, load_model
    from attnscope.records.check_report import TOLERANCE, CheckReport
    from attnscope.records.generation import GenerationTrace
    from attnscope.records.trace import EncoderDecoderTrace, Trace
    from attnscope.records.translation import Seq2SeqGeneration
    from attnscope.tokens import Token
    from attnscope.tracing.decoding import generate
    from attnscope.tracing.one_pass import trace
    from attnscope.tracing.seq2seq import trace_seq2seq
    from attnscope.tracing.seq2seq_decoding import generate_seq2seq


__getattr__ = _lazy.exports("attnscope", _EXPORTS)


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
