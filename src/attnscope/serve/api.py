"""The JSON bodies of `POST /api/trace` and `POST /api/explain`: their fields and parsed forms."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from attnscope.serve.binary import MEDIA_TYPE, PRECISIONS
from attnscope.serve.fields import ENCODINGS, Field
from attnscope.serve.maps import MODES as MAP_MODES
from attnscope.serve.settings import Settings
from attnscope.stages import ARRAYS, DERIVED


class TextRequest(Protocol):
    """What every request that traces a text names: the text, its pair, model and length."""

    @property
    def text(self) -> str: ...
    @property
    def pair(self) -> str | None: ...
    @property
    def model(self) -> str | None: ...
    @property
    def max_length(self) -> int | None: ...
    @property
    def truncate(self) -> bool: ...


@dataclass(frozen=True)
class TraceRequest:
    text: str
    pair: str | None
    model: str | None
    max_length: int | None
    truncate: bool
    stages: tuple[str, ...]
    encoding: str
    payload: bool
    sources: tuple[str, ...]
    precision: str = "float32"  # binary arrays only (attnscope.serve.binary.PRECISIONS)
    maps: str = "inline"  # the payload's maps: inline, lazy (GET /api/trace/ID/map) or auto (attnscope.serve.maps)
    binary: bool = False  # from the Accept header, not the body: arrays as attnscope.serve.binary
    target: str | None = None  # encoder-decoder models: the decoder's text (attnscope.serve.seq2seq)


@dataclass(frozen=True)
class ExplainRequest:
    text: str
    pair: str | None
    model: str | None
    max_length: int | None
    truncate: bool
    layer: int
    head: int
    token: int | None
    arrays: str = "all"  # EXPLAIN_ARRAYS: every value (as `attnscope explain --format json`) or what the page shows


EXPLAIN_ARRAYS = ("all", "shown")


@dataclass(frozen=True)
class NeuronRequest:
    text: str
    pair: str | None
    model: str | None
    max_length: int | None
    truncate: bool
    layer: int
    head: int
    query: int | None = None  # one query row of the [query, key] stages (and of q, context); None: every row
    binary: bool = False  # from the Accept header, not the body: the block's arrays as attnscope.serve.binary


def text_fields(settings: Settings, models: Sequence[str], shortest: int = 2) -> list[Field]:
    """What to trace: the fields both endpoints share (one trace is cached for both).

    shortest: the least max_length any served model accepts for one text (tokens.shortest_max_length);
    a pair needs more, which the library refuses with 422 naming the least.
    """
    return [
        Field("text", "string", "The sentence to trace.", required=True, max_length=settings.max_chars),
        Field("pair", "string", "An optional second sentence (segment B).", nullable=True,
              max_length=settings.max_chars),
        Field("model", "string", "A model this server serves (GET /api/models); null for the default.",
              nullable=True, enum=tuple(models)),
        Field("max_length", "integer", "Maximum tokens, special tokens included; null for the server's "
              f"limit ({settings.max_tokens}) or the model's, whichever is smaller.",
              nullable=True, minimum=shortest, maximum=settings.max_tokens),
        Field("truncate", "boolean", "Keep the first max_length tokens of a longer text (true) or refuse "
              "it with 422 (false).", default=True),
    ]


def trace_fields(settings: Settings, models: Sequence[str], shortest: int = 2) -> list[Field]:
    return [
        *text_fields(settings, models, shortest),
        Field("target", "string", "Encoder-decoder models (T5, BART, Marian): the target, fed to the decoder "
              "teacher-forced (text is the source); null: generated greedily. The answer then has `kinds` "
              "(encoder, decoder, cross). A target for another model: 422.", nullable=True,
              max_length=settings.max_chars),
        Field("stages", "array", "Arrays to return, by the stage names of saved traces (axes in each "
              "array's `axes`).", default=("weights",), enum=ARRAYS, max_length=len(ARRAYS)),
        Field("encoding", "string", "How arrays are sent: base64 of little-endian float32 in C order, "
              "or nested JSON lists.", default="base64", enum=ENCODINGS),
        Field("payload", "boolean", "Also return the views' JSON payload (what the page renders), with the "
              "raw weights as its source.", default=False),
        Field("sources", "array", "More sources for the payload: norm-based attention per head and per layer, "
              "attention rollout, attention flow (slow: seconds beyond 50 tokens, refused beyond 64).",
              default=(), enum=DERIVED, max_length=len(DERIVED)),
        Field("precision", "string", "The arrays' dtype in a binary response (Accept: "
              f"{MEDIA_TYPE}): float32 exact, float16, or uint8 with one scale per [query, key] map "
              "(other arrays float16); JSON arrays are always float32.", default="float32", enum=PRECISIONS),
        Field("maps", "string", "The payload's maps: 'inline' (every map in the payload), 'lazy' (scales and "
              "overviews only; each map from GET /api/trace/{id}/map when shown) or 'auto' (lazy for a large "
              "trace: more than 2^24 weights).", default="inline", enum=MAP_MODES),
    ]


def _layer_head(layers: int, heads: int) -> list[Field]:
    return [Field("layer", "integer", "Layer, 0-indexed.", default=0, minimum=0, maximum=layers - 1),
            Field("head", "integer", "Head, 0-indexed.", default=0, minimum=0, maximum=heads - 1)]


def head_fields(settings: Settings, models: Sequence[str], layers: int, heads: int,
                shortest: int = 2) -> list[Field]:
    """POST /api/neuron's: the text, a layer and head, and optionally one query row."""
    return [
        *text_fields(settings, models, shortest),
        *_layer_head(layers, heads),
        Field("query", "integer", "One query token (0-indexed): q, context, scores and weights hold that "
              "query's row only (what the neuron view shows: 1.1 MB instead of 36 MB at 2,048 SmolLM2 tokens), "
              "k and v every key's; the block then has `query`. null: every row.",
              nullable=True, minimum=0, maximum=settings.max_tokens - 1),
    ]


def explain_fields(settings: Settings, models: Sequence[str], layers: int, heads: int,
                   shortest: int = 2) -> list[Field]:
    return [
        *text_fields(settings, models, shortest),
        *_layer_head(layers, heads),
        Field("token", "integer", "Focus on one query token (0-indexed); null for every query.",
              nullable=True, minimum=0, maximum=settings.max_tokens - 1),
        Field("arrays", "string", "'all': every array whole, as nested lists (as `attnscope explain --format "
              "json`); 'shown': what the web app's explanation shows of each (its first 10 rows, the focused "
              "query's and the last 2; its first 62 and last 2 columns, every key of a key stage), each step's "
              "`shown` naming the shape and the rows and columns kept (docs/serve.md).", default="all",
              enum=EXPLAIN_ARRAYS),
    ]
