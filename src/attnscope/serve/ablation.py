"""What an intervention costs, and running it within the server's deadline and memory ceiling.

`POST /api/ablate` with `each` runs one forward row per head of the model (plus the untouched row), and
`/api/patch` two per head; on a long text that is minutes of work and gigabytes of activations in one batch.
So, holding the model's lock:

- one row of the text is timed first (and a batch of rows, when that is cheap), and a job whose rows x
  that time would pass the request's deadline is refused (422) up front, saying how many heads or tokens
  would fit;
- one row's activations are estimated from the model's widths (`row_bytes`), and a one-kind model's grid
  runs in batches that fit between the resident memory and the ceiling (at most BATCH_ROWS rows each);
  an intervention that cannot be split (patch, encoder-decoders) is refused when its one batch cannot fit;
- every layer of every forward first checks the job's stop event (`stopping`): a job whose client left or
  whose deadline passed ends within one layer of one batch, and the model's lock is released.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from attnscope.errors import AttnscopeError
from attnscope.interventions.ablate import setting_gates
from attnscope.interventions.effects import Probe, effects, outputs
from attnscope.interventions.gates import Head, HeadEdit, n_layers_heads
from attnscope.models import Model
from attnscope.serve import memory
from attnscope.serve.pool import checkpoint

BATCH_ROWS = 16  # at most this many rows per forward: a stop is seen within one layer of 16 rows
_HEADROOM = 2  # a batch may use half of the memory left under the ceiling (allocator slack, temporaries)


@dataclass(frozen=True)
class Cost:
    """An intervention's work: `rows` forward rows of `tokens` tokens, one row timed and sized."""

    rows: int
    tokens: int
    row_seconds: float  # one row's forward, measured on this text (alone, or in a batch: the less)
    row_bytes: int  # one row's activations, estimated (row_bytes)

    @property
    def seconds(self) -> float:
        return self.rows * self.row_seconds


def layers(m: Model) -> list[nn.Module]:
    """The model's repeated blocks (every item of every ModuleList): where a forward may stop."""
    return [layer for mod in m.model.modules() if isinstance(mod, nn.ModuleList) for layer in mod]


@contextlib.contextmanager
def stopping(m: Model, stop: threading.Event) -> Iterator[None]:
    """Every forward of `m` inside checks `stop` before each layer (pool.Cancelled once it is set)."""
    handles = [layer.register_forward_pre_hook(lambda *_: checkpoint(stop)) for layer in layers(m)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def row_bytes(m: Model, tokens: int) -> int:
    """One row's peak activations in float32: the hidden states and residuals (~8 x d_model per token), the
    widest projection (the MLP's inner width, x3: its input, activation and gate), and eager attention's
    scores, weights and mask [head, query, key] (x3)."""
    embeddings: Any = m.model.get_input_embeddings()
    d_model = int(embeddings.weight.shape[1])
    widths = [getattr(mod, "out_features", None) or getattr(mod, "nf", None) for layer in layers(m)
              for mod in layer.modules()]
    widest = max([int(w) for w in widths if w], default=4 * d_model)
    return 4 * tokens * (8 * d_model + 3 * widest + 3 * m.n_heads * tokens)


def timed(forward: Callable[[], Any]) -> float:
    """Seconds one call of forward() takes (no gradients)."""
    started = time.perf_counter()
    with torch.no_grad():
        forward()
    return time.perf_counter() - started


def measure(forward: Callable[[int], Any], rows: int, tokens: int, row_bytes: int, deadline: float) -> Cost:
    """The cost of `rows` rows of forward(n_rows): one row timed; when rows x that would not fit before the
    deadline and a batch is cheap to time, BATCH_ROWS rows timed too (a short text's rows cost several times
    less in a batch; a long text's barely less, and timing its batch would spend the deadline)."""
    cost = Cost(rows=rows, tokens=tokens, row_seconds=timed(lambda: forward(1)), row_bytes=row_bytes)
    batch = min(rows, BATCH_ROWS)
    left = deadline - time.monotonic()
    if cost.seconds > left and batch * cost.row_seconds < left / 2:
        per_row = timed(lambda: forward(batch)) / batch
        cost = Cost(rows=rows, tokens=tokens, row_seconds=min(cost.row_seconds, per_row), row_bytes=row_bytes)
    return cost


def batch_rows(cost: Cost, ceiling: int) -> int:
    """Rows per forward so that a batch fits in what is left under the memory ceiling (at least 1)."""
    room = (ceiling - memory.rss_bytes()) // _HEADROOM
    return max(1, min(BATCH_ROWS, cost.rows, room // max(1, cost.row_bytes)))


def admit(cost: Cost, deadline: float, what: str, split: bool, ceiling: int) -> None:
    """Refuse (AttnscopeError: 422) a job that cannot finish before `deadline` (time.monotonic()), or whose one
    batch (split=False) cannot fit under the memory ceiling, saying how big it may be."""
    admit_by_deadline(cost.seconds, deadline, f"{what} needs {cost.rows} forward rows of {cost.tokens} tokens, about "
                      f"{cost.seconds:.0f} s at the {cost.row_seconds:.2f} s one row took here",
                      lambda left: _fits(max(0, int(left / cost.row_seconds)), int(cost.tokens * left / cost.seconds)),
                      parameter="each")
    room = (ceiling - memory.rss_bytes()) // _HEADROOM
    if not split and cost.rows * cost.row_bytes > room:
        rows = max(0, room // max(1, cost.row_bytes))
        tokens = int(cost.tokens * (rows / cost.rows) ** 0.5)  # attention's share grows with the square
        raise AttnscopeError(f"{what} needs {cost.rows} forward rows of {cost.tokens} tokens in one batch, about "
                             f"{cost.rows * cost.row_bytes >> 20} MiB, over the {room >> 20} MiB this server may "
                             f"use under its memory ceiling: {_fits(rows, tokens)}, or start the server with a "
                             "larger --max-memory")


def admit_by_deadline(seconds: float, deadline: float, need: str, fix: Callable[[float], str], parameter: str) -> None:
    """Refuse (AttnscopeError: 422) a job estimated at `seconds` that cannot finish before `deadline`
    (time.monotonic()): "{need}, over the N s left before this request's deadline: {fix(N)}, or start the server
    with a longer --timeout". need: what the job needs and about how long that takes here; fix: given the seconds
    left, what would fit in them."""
    left = deadline - time.monotonic()
    if seconds <= left:
        return
    raise AttnscopeError(f"{need}, over the {max(0.0, left):.0f} s left before this request's deadline: {fix(left)}, "
                         "or start the server with a longer --timeout", parameter=parameter)


def _fits(rows: int, tokens: int) -> str:
    heads = max(0, rows - 2)
    if heads == 0:
        return f"shorten the text to about {max(1, tokens)} tokens"
    return (f"about {rows} rows fit, so name at most {heads} heads instead of each, or shorten the text to "
            f"about {max(1, tokens)} tokens")


def grid_in_batches(probe: Probe, chosen: Sequence[Head], source: list[torch.Tensor | None] | None,
                    batch: int) -> dict[str, Any]:
    """The measures of ablate's rows (untouched, `chosen` removed together, then each head alone), `batch` rows
    per forward; each batch repeats the untouched row, whose copies are dropped, so effects() reads the rows
    as one forward would give them."""
    m = probe.model
    scale = setting_gates(m, [list(chosen)] if chosen else [], True)  # [layer, row, head]
    n_rows = int(scale.shape[1])
    parts: list[dict[str, torch.Tensor]] = []
    step = max(1, batch - 1)
    with torch.no_grad():
        for first in range(1, n_rows, step):
            rows = [0, *range(first, min(n_rows, first + step))]
            part = scale[:, rows, :].contiguous()
            out = outputs(probe, probe.rows(len(rows)), HeadEdit(n_layers_heads(m)[0], part, source))
            parts.append({k: v if not parts else v[1:] for k, v in out.items()})
    return effects(probe.kind, {k: torch.cat([p[k] for p in parts]) for k in parts[0]})

