"""The generation trace: a decoder writing one token at a time, as a plain record (torch-free).

`attnscope.generate` (attnscope.tracing.decoding) makes one inside the real `model.generate` loop; views and saved-file
readers use this module without loading torch or transformers.

Step s (0-indexed) writes the token at position P + s (P prompt tokens). It is predicted by the query at
position P + s - 1, the last token so far, attending over keys 0 .. P + s - 1 (the prompt and the tokens
written before it, held in the KV cache). Step 0 is the prefill: one forward pass over the whole prompt.
The `trace` holds every attention row the generation computed, one per position 0 .. P + N - 2 (the last
token written is never read back), in the arrays and stage names of any Trace.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from attnscope.errors import AttnscopeError, validate_index
from attnscope.records import check_report as report
from attnscope.records import files
from attnscope.records.arrays import token_index
from attnscope.records.trace import Trace, file_arrays, file_metadata, load_trace_and_metadata
from attnscope.stages import ARRAY_AXES
from attnscope.tokens import Token

STOP_REASONS = ("eos", "max_new_tokens", "interrupted")


@dataclass(frozen=True)
class Alternative:
    """A candidate for a step's token and its probability. text: as the tokenizer spells it ("Ġthe"); decoded: the
    tokenizer's own decoding of that piece alone (" the"), None in generations saved before it was kept."""

    id: int
    text: str
    probability: float
    decoded: str | None = None

    @property
    def shown(self) -> str:
        """The candidate as a person reads it: its decoding when known, else its piece (as Token.shown)."""
        return self.text if self.decoded is None else self.decoded


@dataclass(frozen=True, kw_only=True)
class GeneratedToken:
    """One step's new token: its probability under the model and the top alternatives (chosen one included).

    probability is the softmax of the model's logits after the generation config's processors and before
    the sampling warpers (temperature, top_k, top_p): the model's own distribution over the next token.
    """

    step: int
    position: int  # its position in the final sequence (0-indexed)
    id: int
    text: str  # the token as the tokenizer spells it (e.g. "Ġthe")
    piece: str  # the text it adds to the decoded output
    probability: float
    alternatives: list[Alternative]
    special: bool = False
    # the tokenizer's own decoding of the piece alone (" the" for "Ġthe"), as Token.decoded; None in generations
    # saved before it was kept (they load as they were). Unlike piece, never empty: a special token or a byte of a
    # character split over tokens reads as its decoder writes it alone
    decoded: str | None = None

    @property
    def shown(self) -> str:
        """The token as a person reads it: its decoding when known, else its piece as spelled."""
        return self.text if self.decoded is None else self.decoded

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GeneratedToken:
        alts = [Alternative(**a) for a in d["alternatives"]]
        return cls(**{**d, "alternatives": alts})


@dataclass
class GenerationTrace:
    """A prompt and the tokens a decoder wrote after it, with every step's attention and its verification.

    trace: the attention rows of positions 0 .. P + N - 2 ([layer, head, query, key] weights etc.);
    comparisons (trace.check()): each step recomputed from the layer's weights with the cached keys and
    values ("recompute"), and every row against one forward pass over the final sequence without a cache
    ("no-cache").
    """

    prompt: str
    trace: Trace
    prompt_tokens: list[Token]
    steps: list[GeneratedToken]
    completion: str  # the decoded new text (special tokens skipped)
    settings: dict[str, Any]  # max_new_tokens, do_sample, temperature, top_k, top_p, seed
    stopped: str  # one of STOP_REASONS

    @property
    def prompt_length(self) -> int:
        return len(self.prompt_tokens)

    @property
    def n_steps(self) -> int:
        return len(self.steps)

    @property
    def model(self) -> dict[str, Any]:
        return self.trace.model

    @property
    def text(self) -> str:
        return self.prompt + self.completion

    @property
    def tokens(self) -> list[Token]:
        """Every token of the final sequence: the prompt's, then each step's."""
        new = [Token(index=s.position, text=s.text, id=s.id, special=s.special, decoded=s.decoded) for s in self.steps]
        return [*self.prompt_tokens, *new]

    def query_position(self, step: int) -> int:
        """The position whose query predicts step's token: the last token before it."""
        self.validate_step(step)
        return self.prompt_length + step - 1

    def validate_step(self, step: int) -> None:
        validate_index("step", step, self.n_steps, owner="this generation")

    def step_weights(self, step: int) -> np.ndarray:
        """The attention of the step's query over every earlier position: [layer, head, key]."""
        pos = self.query_position(step)
        row: np.ndarray = self.trace.weights[:, :, pos, : pos + 1]
        return row

    def attended(self, step: int, layer: int, head: int | None = None, k: int = 3) -> list[tuple[int, float]]:
        """The k earlier positions the step's query attends to most, with their weight: one head's, or the
        mean over the layer's heads (head None). Layers and heads are 0-indexed."""
        self.trace.validate(layer=layer, head=head)
        w = self.step_weights(step)[layer]  # [head, key]
        row = w.mean(axis=0) if head is None else w[head]  # [key]
        top = np.argsort(-row, kind="stable")[:k]
        return [(int(i), float(row[i])) for i in top]

    def check(self, tolerance: float | None = None) -> report.CheckReport:
        """Both comparisons; tolerance by default follows the dtype the model ran in (1e-5 for float32)."""
        return self.trace.check(tolerance)

    def step_trace(self, step: int) -> Trace:
        """What the step's query saw: a Trace of positions 0 .. its own (the cache, then itself), whose last
        row is the step's attention. Its check is the whole generation's."""
        n = self.query_position(step) + 1
        tr = self.trace
        kept = [name for name in tr.arrays if name in ARRAY_AXES and name != "flow"]  # flow mixes later rows in
        arrays = {name: tr.arrays[name][token_index(name, n)] for name in kept}
        sub = Trace(model=tr.model, text=tr.text, pair=None, tokens=tr.tokens[:n], arrays=arrays, scaling=tr.scaling,
                    comparisons=tr.comparisons, unsupported=tr.unsupported)
        sub.saved_check = tr.saved_check
        return sub

    def metadata(self) -> dict[str, Any]:
        """Everything but the arrays, JSON-able (saved under the "generation" key)."""
        return {
            "prompt": self.prompt,
            "prompt_tokens": [t.to_dict() for t in self.prompt_tokens],
            "steps": [s.to_dict() for s in self.steps],
            "completion": self.completion,
            "settings": self.settings,
            "stopped": self.stopped,
        }

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write `.safetensors` or `.npz`: the trace's arrays by stage name (loadable by Trace.load too)."""
        save_generation(self, path)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> GenerationTrace:
        return load_generation(path)

    def to_html(self, raw_tokens: bool = False) -> str:
        """The generation view: a self-contained page with play/pause and a step slider. Tokens as they read (the
        tokenizer's decoding of each piece); raw_tokens=True: as the tokenizer spells them ("Ġthe")."""
        from attnscope.views.generation import generation_html

        return generation_html(self, raw_tokens=raw_tokens)

    def show(self, raw_tokens: bool = False) -> Any:
        """The generation view as an HTMLPage: displays itself in Jupyter, .save(path) writes the file."""
        from attnscope.views.generation import generation_page

        return generation_page(self, raw_tokens=raw_tokens)

    def _repr_html_(self) -> str:
        from attnscope.views import iframe

        return iframe(self.to_html(), height=720)

    def __repr__(self) -> str:
        return (f"GenerationTrace(model={self.model.get('name')!r}, prompt_tokens={self.prompt_length}, "
                f"steps={self.n_steps}, stopped={self.stopped!r})")


def save_generation(g: GenerationTrace, path: str | os.PathLike[str]) -> None:
    """The trace's file (records.trace.file_arrays and file_metadata) with the generation in its metadata."""
    meta = {**file_metadata(g.trace), "generation": g.metadata()}
    files.write(Path(path), file_arrays(g.trace), meta, {"tokens": g.trace.token_strings}, what="a generation")


def load_generation(path: str | os.PathLike[str]) -> GenerationTrace:
    """Read a file written by GenerationTrace.save; a plain trace file is an error that says so."""
    p = Path(path)
    tr, meta = load_trace_and_metadata(p)  # validates the file and its format, with one-line errors
    gen = meta.get("generation")
    if gen is None:
        raise AttnscopeError(f"{p} holds a trace, not a generation: write one with `attnscope generate ... -o FILE`")
    return GenerationTrace(
        prompt=gen["prompt"], trace=tr, prompt_tokens=[Token(**t) for t in gen["prompt_tokens"]],
        steps=[GeneratedToken.from_dict(s) for s in gen["steps"]], completion=gen["completion"],
        settings=dict(gen["settings"]), stopped=str(gen["stopped"]),
    )
