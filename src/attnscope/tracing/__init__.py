"""The producers: run the real model and capture its attention.

- `one_pass`: a text (or a batch) through an encoder or decoder -> `records.trace.Trace`;
- `seq2seq`: a source and a target through an encoder-decoder -> `records.trace.EncoderDecoderTrace`;
- `decoding`: a decoder writing step by step -> `records.generation.GenerationTrace`;
- `seq2seq_decoding`: an encoder-decoder translating step by step -> `records.translation.Seq2SeqGeneration`.

`from attnscope.tracing import trace` keeps working (this was once the module that held `trace`).
"""

from __future__ import annotations

from attnscope import _lazy

_EXPORTS = {
    "trace": "attnscope.tracing.one_pass",
    "Trace": "attnscope.records.trace",
    "trace_seq2seq": "attnscope.tracing.seq2seq",
    "generate": "attnscope.tracing.decoding",
    "generate_seq2seq": "attnscope.tracing.seq2seq_decoding",
}


__getattr__ = _lazy.exports("attnscope.tracing", _EXPORTS)
