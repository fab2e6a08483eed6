"""An encoder-decoder model translating step by step, as a plain record (torch-free).

`attnscope.tracing.seq2seq_decoding.generate_seq2seq` makes one: the model generates the target one token at a time
with its own `generate` loop and KV cache; the record holds each step's token (probability, alternatives) and an
EncoderDecoderTrace of the whole generation. Step s (0-indexed) writes target token s + 1 of the decoder's
sequence (token 0 is the decoder start token); its query is decoder position s, so the trace's row s is that
step's attention: the decoder's over the target so far, and the cross-attention over the source (the step's
"alignment": which source tokens the new target token reads).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from attnscope.records import check_report as report
from attnscope.records.generation import GeneratedToken
from attnscope.records.trace import EncoderDecoderTrace


@dataclass
class Seq2SeqGeneration:
    """A source, the target the model wrote for it token by token, and every step's verified attention.

    trace: the three kinds of attention over the source and the decoder's input (the start token, then each
    generated token but the last); its checks hold, beside the recompute and the model's own outputs, each
    step's rows from the generate loop itself ("generate": the attentions `model.generate` returned, with its KV
    cache) against the trace's rows.
    """

    trace: EncoderDecoderTrace
    steps: list[GeneratedToken]
    settings: dict[str, Any]  # max_new_tokens, do_sample (False: greedy)
    stopped: str  # "eos" or "max_new_tokens"

    @property
    def source(self) -> str:
        return self.trace.source

    @property
    def completion(self) -> str:
        """The generated target (special tokens skipped)."""
        return self.trace.target_text

    @property
    def model(self) -> dict[str, Any]:
        return self.trace.model

    @property
    def n_steps(self) -> int:
        return len(self.steps)

    def validate_step(self, step: int) -> None:
        from attnscope.errors import validate_index

        validate_index("step", step, self.n_steps, owner="this generation")

    def alignment(self, step: int) -> np.ndarray:
        """The step's cross-attention over the source tokens: [layer, head, source]."""
        self.validate_step(step)
        row: np.ndarray = self.trace.cross.weights[:, :, step, :]
        return row

    def aligned(self, step: int, layer: int, head: int | None = None, k: int = 3) -> list[tuple[int, float]]:
        """The k source tokens the step's query reads most, with their weight: one head's, or the mean over the
        layer's heads (head None). Layers and heads are 0-indexed."""
        self.trace.cross.validate(layer=layer, head=head)
        w = self.alignment(step)[layer]  # [head, source]
        row = w.mean(axis=0) if head is None else w[head]  # [source]
        top = np.argsort(-row, kind="stable")[:k]
        return [(int(i), float(row[i])) for i in top]

    def check(self, tolerance: float | None = None) -> dict[str, report.CheckReport]:
        """Each kind's verification: "encoder", "decoder", "cross" -> its CheckReport."""
        return self.trace.check(tolerance)

    def status(self, tolerance: float | None = None) -> str:
        return self.trace.status(tolerance)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the EncoderDecoderTrace (`.safetensors` or `.npz`; load it with EncoderDecoderTrace.load): the
        generated target, every kind's arrays and checks, the generate loop's comparisons among them. The steps'
        probabilities and alternatives are not in the file."""
        self.trace.save(path)

    def to_html(self, raw_tokens: bool = False) -> str:
        """The translation view: a self-contained page, the target growing step by step, the source shaded by each
        step's alignment, and the alignment matrix (attnscope.views.translation). Tokens as they read (the
        tokenizer's decoding of each piece); raw_tokens=True: as the tokenizer spells them."""
        from attnscope.views.translation import translation_html

        return translation_html(self, raw_tokens=raw_tokens)

    def _repr_html_(self) -> str:
        from attnscope.views import iframe

        return iframe(self.to_html(), height=720)

    def __repr__(self) -> str:
        return (f"Seq2SeqGeneration(model={self.model.get('name')!r}, source_tokens={self.trace.encoder.n_tokens}, "
                f"steps={self.n_steps}, stopped={self.stopped!r})")


__all__ = ["Seq2SeqGeneration"]
