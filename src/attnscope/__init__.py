"""attnscope: open up the self-attention inside real transformer models.

    >>> import attnscope
    >>> tr = attnscope.trace("time flies like an arrow")   # the bundled all-MiniLM-L6-v2
    >>> tr.check().ok
    True

Names are imported on first use, so `import attnscope` (and the CLI's --help) stays fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "TOLERANCE": "attnscope.report",
    "CheckReport": "attnscope.report",
    "AttnscopeError": "attnscope.errors",
    "DEFAULT_MODEL": "attnscope.models",
    "Model": "attnscope.models",
    "load_model": "attnscope.models",
    "Token": "attnscope.tokens",
    "Trace": "attnscope.traces",
    "trace": "attnscope.tracing",
    "trace_seq2seq": "attnscope.seq2seq",
    "generate_seq2seq": "attnscope.seq2seq_generating",
    "Seq2SeqGeneration": "attnscope.seq2seq_generation",
    "EncoderDecoderTrace": "attnscope.traces",
    "generate": "attnscope.generating",
    "GenerationTrace": "attnscope.generation",
    "walkthrough": "attnscope.explain",
    "Walkthrough": "attnscope.explain",
}

__all__ = [
    "DEFAULT_MODEL",
    "TOLERANCE",
    "AttnscopeError",
    "CheckReport",
    "EncoderDecoderTrace",
    "GenerationTrace",
    "Model",
    "Seq2SeqGeneration",
    "Token",
    "Trace",
    "Walkthrough",
    "generate",
    "generate_seq2seq",
    "load_model",
    "trace",
    "trace_seq2seq",
    "walkthrough",
]

if TYPE_CHECKING:
    from attnscope.errors import AttnscopeError
    from attnscope.explain import Walkthrough, walkthrough
    from attnscope.generating import generate
    from attnscope.generation import GenerationTrace
    from attnscope.models import DEFAULT_MODEL, Model, load_model
    from attnscope.report import TOLERANCE, CheckReport
    from attnscope.seq2seq import trace_seq2seq
    from attnscope.seq2seq_generating import generate_seq2seq
    from attnscope.seq2seq_generation import Seq2SeqGeneration
    from attnscope.tokens import Token
    from attnscope.traces import EncoderDecoderTrace, Trace
    from attnscope.tracing import trace


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'attnscope' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
