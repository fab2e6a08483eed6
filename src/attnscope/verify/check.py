"""Compare recompute vs capture vs the model's own outputs: max abs error per layer, head and stage.

The results (Comparison, CheckReport) live in the torch-free `attnscope.records.check_report`."""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

from attnscope.maths import AttentionParams, Window, expand_kv
from attnscope.records.check_report import RELATIVE, TOLERANCE, CheckReport, Comparison, report_from_dict
from attnscope.stages import ARRAY_AXES, TOKEN_AXES
from attnscope.verify.recompute import (
    CHUNK_BYTES,
    PROJECTED_STAGES,
    RECOMPUTED_STAGES,
    layer_mask,
    query_blocks,
    recompute_layer,
    row_chunks,
)

PER_HEAD = ("q", "k", "v", "scores", "weights", "context")  # arrays [layer, head, ...]
PER_LAYER = ("x", "output")  # arrays [layer, token, d_model]
PER_KV_HEAD = ("k", "v")  # arrays [layer, kv_head, ...]: an error counts for every query head that reads it


class ErrorTable:
    """Max errors of a padded batch, filled one layer at a time: nothing else is kept.

    For each (stage, source), errors[row] is [layer, head] (per-head stages) or [layer, 1].
    """

    def __init__(self, keep: torch.Tensor, n_layers: int, n_heads: int, key_keep: torch.Tensor | None = None) -> None:
        self.keep = keep.bool()  # [batch, token]: False on padding
        # cross-attention: keys (and k, v) run over the source, [batch, key]; self-attention: keep
        self.key_keep = self.keep if key_keep is None else key_keep.bool()
        self.padded = not bool(self.keep.all()) or not bool(self.key_keep.all())
        self.n_layers, self.n_heads = n_layers, n_heads
        self.errors: dict[tuple[str, str], np.ndarray] = {}  # [row, layer, head|1]
        self._scratch: dict[tuple[str, tuple[int, ...]], torch.Tensor] = {}
        self._compared: set[tuple[str, int, int]] = set()  # (stage, layer, row) compared with the recompute

    def _valid(self, stage: str) -> torch.Tensor:
        """Where a [batch, ...] array of this stage holds real (unpadded) positions: keep on each token axis."""
        axes = ARRAY_AXES[stage][1:]  # after the layer axis; the batch axis comes first here
        valid = torch.ones((), dtype=torch.bool)
        for i, axis in enumerate(axes):
            if axis in TOKEN_AXES:
                side = self.key_keep if axis == "key" or stage in PER_KV_HEAD else self.keep
                shape = [-1] + [1] * len(axes)
                shape[i + 1] = side.shape[1]
                valid = valid & side.view(shape)
        return valid

    def add(self, stage: str, source: str, layer: int, captured: torch.Tensor, other: torch.Tensor) -> None:
        """captured, other: one layer of the batch, [batch, ...] with the stage's axes."""
        if captured is other:  # the model returned the very tensor the capture saw
            self._table(stage, source)[:, layer] = self._same(stage, captured)
            return
        for rows in row_chunks(captured[0].numel(), int(captured.shape[0])):
            self.add_rows(stage, source, layer, rows, captured[rows], other[rows])

    def add_rows(self, stage: str, source: str, layer: int, rows: slice, captured: torch.Tensor,
                 other: torch.Tensor, disposable: bool = False, part: bool = False) -> None:
        """captured, other: some rows of one layer of the batch, [rows, ...]. disposable: other is float32 and
        nobody reads it again (the recompute's own chunk), so |other - captured| is formed in it, in place.
        part: one part of each row (a block of queries, compare_chunk): its errors join the others' (the max)."""
        a = captured.float()
        # the same numbers at every position, none NaN or infinite: |a - b| is 0. Recomputed weights come out of
        # our softmax, each in [0, 1] or NaN, which no comparison finds equal: equal, they are finite without a sum
        # (a model's own weights are not ours: they keep it)
        if _equal_and_finite(a, other, probabilities=stage == "weights" and source == "recompute"):
            self._put(stage, source, rows, layer, 0.0, part)
        else:
            self._put(stage, source, rows, layer, self._reduce(stage, self._diff(a, other, disposable), rows), part)
        if source == "recompute":
            self._compared.update((stage, layer, row) for row in range(*rows.indices(self.keep.shape[0])))

    def _put(self, stage: str, source: str, rows: slice, layer: int, errors: np.ndarray | float, part: bool) -> None:
        """Write these rows' errors of a layer ([rows, head|1]); part: the max of them and what is there (the
        table starts at 0; NaN stays NaN)."""
        table = self._table(stage, source)
        table[rows, layer] = np.maximum(table[rows, layer], errors) if part else errors

    def add_hidden(self, stage: str, layer: int, rows: slice, captured: torch.Tensor) -> None:
        """Captured weights [rows, head, query, key] where the recompute's are the softmax's exact 0 (keys the mask
        hid, past a block of queries: compare_chunk): their largest magnitude per head joins the rows' errors."""
        if captured.numel() == 0:
            return
        dims = tuple(range(2, captured.dim()))
        # amax and amin each carry a NaN through; the larger of |max| and |min| is the largest |value|
        largest = torch.maximum(captured.amax(dim=dims), captured.amin(dim=dims).neg())  # [rows, head]
        self._put(stage, "recompute", rows, layer, self._per_query_head(stage, largest.float().numpy()), True)

    def _diff(self, a: torch.Tensor, other: torch.Tensor, disposable: bool) -> torch.Tensor:
        """|a - other|, in other itself when disposable (see add_rows), else in a scratch buffer."""
        if disposable and other.dtype == torch.float32:
            return other.sub_(a).abs_()  # |b - a| = |a - b|, in a buffer already in the cache
        return torch.sub(a, other.float(), out=self.scratch("diff", a.shape)).abs_()

    def add_scores(self, layer: int, rows: slice, q: torch.Tensor, k: torch.Tensor,
                   recomputed: torch.Tensor | None) -> None:
        """The trace's scores, q k^T of the captured q and k [rows, head|kv_head, token, d_head], against the
        recomputed [rows, head, query, key], relative to max(1, |q_i| |k_j|).

        Where the recomputed q and k were found equal to the captured ones at every real position (their
        errors, already in the table, are exactly 0, which NaN and infinity never give), the two scores
        there are one product of the same numbers: the difference is 0 without forming q k^T again (and the
        recompute, asked needs_scores, formed none: recomputed is None).
        """
        table = self._table("scores", "recompute")
        if self._equal_so_far("q", layer, rows) and self._equal_so_far("k", layer, rows):
            table[rows, layer] = 0.0
            return
        if recomputed is None:
            raise RuntimeError(f"layer {layer}: the recompute formed no scores, but q or k differ from the capture")
        shape = recomputed.shape
        k = expand_kv(k, int(q.shape[1]) // int(k.shape[1]))  # [rows, head, key, d_head]
        diff = torch.matmul(q, k.transpose(-1, -2), out=self.scratch("diff", shape)).sub_(recomputed).abs_()
        bound = torch.mul(q.norm(dim=-1)[..., :, None], k.norm(dim=-1)[..., None, :], out=self.scratch("bound", shape))
        table[rows, layer] = self._reduce("scores", diff.div_(bound.clamp_(min=1.0)), rows)

    def needs_scores(self, layer: int) -> bool:
        """Whether the recomputed scores of this layer are needed: unless q and k of every row were found equal."""
        every = slice(0, int(self.keep.shape[0]))
        return not (self._equal_so_far("q", layer, every) and self._equal_so_far("k", layer, every))

    def _equal_so_far(self, stage: str, layer: int, rows: slice) -> bool:
        """Whether these rows of this stage were compared with the recompute and found equal everywhere."""
        done = self.errors.get((stage, "recompute"))
        compared = all((stage, layer, row) in self._compared for row in range(*rows.indices(self.keep.shape[0])))
        return compared and done is not None and bool(np.all(done[rows, layer] == 0.0))

    def add_output(self, layer: int, rows: slice, context: torch.Tensor, w_o_norms: torch.Tensor,
                   captured: torch.Tensor, recomputed: torch.Tensor, part: bool = False) -> None:
        """The captured output [rows, token, d_model] against the recomputed one, relative to
        max(1, |merged_i| |W_O[:, j]|), merged: the captured context [rows, head, token, d_head], heads side by side.
        part: some of the tokens (add_rows)."""
        if _equal_and_finite(captured.float(), recomputed):  # |a - b| is 0 everywhere, and so is its ratio
            self._put("output", "recompute", rows, layer, 0.0, part)
            return
        merged_norm = context.float().pow(2).sum(dim=(1, 3)).sqrt_()  # [rows, token]
        diff = torch.sub(captured.float(), recomputed, out=self.scratch("diff", captured.shape)).abs_()
        bound = torch.mul(merged_norm[..., None], w_o_norms, out=self.scratch("bound", captured.shape))
        self._put("output", "recompute", rows, layer, self._reduce("output", diff.div_(bound.clamp_(min=1.0)), rows),
                  part)

    def _table(self, stage: str, source: str) -> np.ndarray:
        width = self.n_heads if stage in PER_HEAD else 1
        return self.errors.setdefault((stage, source), np.zeros((self.keep.shape[0], self.n_layers, width)))

    def _reduce(self, stage: str, diff: torch.Tensor, rows: slice) -> np.ndarray:
        """Max of |difference| per row and head ([rows, head] or [rows, 1]), over real positions only."""
        if self.padded:  # a fill rather than a product: padding drops out, a NaN in real positions stays
            diff.masked_fill_(~self._valid(stage)[rows], 0.0)
        # over the axes after [rows, head] without flattening (a copy where the capture's layout is permuted)
        reduced = diff.amax(dim=tuple(range(2, diff.dim()))) if stage in PER_HEAD else \
            diff.flatten(1).amax(1, keepdim=True)
        return self._per_query_head(stage, reduced.numpy())

    def _per_query_head(self, stage: str, errors: np.ndarray) -> np.ndarray:
        """[rows, kv_head] -> [rows, head]: query head h reads k/v head h // groups."""
        if stage not in PER_KV_HEAD or errors.shape[1] == self.n_heads:
            return errors
        return np.repeat(errors, self.n_heads // errors.shape[1], axis=1)

    def add_same_rows(self, stage: str, source: str, layer: int, rows: slice, captured: torch.Tensor) -> None:
        """The captured rows [rows, ...] against the very same tensor (the model returned what the capture saw),
        once they were compared with the recompute: a finite difference there proves them finite, so |a - a| is
        0; only where it was not is _same asked."""
        checked = self._table(stage, "recompute")[rows, layer]
        same = 0.0 if np.isfinite(checked).all() else self._same(stage, captured, rows)
        self._table(stage, source)[rows, layer] = same

    def _same(self, stage: str, t: torch.Tensor, rows: slice = slice(None)) -> np.ndarray:
        """|a - a| without the subtraction: 0, or NaN where a real position holds NaN or infinity.
        t: the given rows of one layer of the batch."""
        if self.padded:
            t = torch.where(self._valid(stage)[rows], t, torch.zeros((), dtype=t.dtype))
        flat = t.flatten(2) if stage in PER_HEAD else t.flatten(1).unsqueeze(1)
        # NaN propagates through amin and amax, and an infinity shows at one end (torch.aminmax is 10x slower)
        ends = flat.amin(2).isfinite() & flat.amax(2).isfinite()
        return self._per_query_head(stage, np.where(ends.numpy(), 0.0, np.nan))

    def scratch(self, name: str, shape: torch.Size) -> torch.Tensor:
        """A float32 buffer reused from chunk to chunk and layer to layer (a fresh big tensor costs a page
        fault every 4 KiB); contiguous, so the per-head maxima read it in order (a permuted capture such as
        Llama's q, [batch, token, head, d_head] in memory, is reduced 3x slower in its own layout)."""
        key = (name, tuple(shape))
        if key not in self._scratch:
            self._scratch[key] = torch.empty(shape, dtype=torch.float32)
        return self._scratch[key]

    def comparisons(self, row: int) -> list[Comparison]:
        order = [*PER_LAYER[:1], *PER_HEAD, *PER_LAYER[1:]]
        keys = sorted(self.errors, key=lambda k: (k[1] != "recompute", order.index(k[0])))
        return [Comparison(st, src, self.errors[(st, src)][row], st in RELATIVE) for st, src in keys]


def _equal_and_finite(a: torch.Tensor, b: torch.Tensor, probabilities: bool = False) -> bool:
    """Whether |a - b| is exactly 0 at every position, without forming it: the sum of b is finite, which a NaN or
    an infinity anywhere in b would prevent (|inf - inf| is NaN), and a == b everywhere (numpy's comparison reads
    each once, where a subtraction, absolute value and max read the difference three times). b first: the
    recompute's b was just written and is still in the cache. Either failing, the caller forms |a - b|:
    differences, NaN and padding are then found and reported as before. probabilities: b is a softmax's output,
    whose numbers are each in [0, 1] or NaN (never infinite), so a == b everywhere proves them finite alone."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return (probabilities or math.isfinite(float(b.sum()))) and bool(np.array_equal(a.numpy(), b.numpy()))


def verify_batch(captured: dict[str, list[torch.Tensor]], reference: dict[str, list[torch.Tensor]],
                 params: list[AttentionParams] | None, keep: torch.Tensor) -> ErrorTable:
    """Recompute each layer of a padded batch from its captured input and compare, one layer at a time.

    captured and reference hold, by stage, one [batch, ...] tensor per layer; keep is the
    [batch, token] 0/1 mask.
    """
    n_layers, n_heads = len(captured["weights"]), int(captured["weights"][0].shape[1])
    table = ErrorTable(keep, n_layers, n_heads)
    check = LayerCheck(table, params, keep) if params is not None and "x" in captured else None
    for layer in range(n_layers):
        at = {stage: ts[layer] for stage, ts in captured.items()}
        ref = {stage: ts[layer] for stage, ts in reference.items()}
        if check is not None:
            check.verify(layer, at, ref)
        else:
            compare_with_model(table, layer, at, ref)
    return table


class LayerCheck:
    """verify_batch one layer at a time, in any order it is handed the layers: a streamed trace checks each
    layer inside the forward pass, while its arrays are there (attnscope.tracing.streamed). Keeps only the table,
    one mask per window and the chunks' scratch buffers between layers."""

    def __init__(self, table: ErrorTable, params: list[AttentionParams], keep: torch.Tensor) -> None:
        self.table, self.params, self.keep = table, params, keep
        n_rows, n_tokens = int(keep.shape[0]), int(keep.shape[1])
        self.chunks = row_chunks(params[0].n_heads * n_tokens * n_tokens if params else 1, n_rows, CHUNK_BYTES)
        self.masks: dict[Window, torch.Tensor | None] = {}  # one mask per distinct window
        self.scratch: dict[str, torch.Tensor] = {}  # the big [rows, head, query, key] tensors, reused

    def verify(self, layer: int, captured: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> None:
        """Recompute `layer` from captured["x"] a few rows at a time and compare every stage (compare_chunk),
        then the model's own outputs for this layer (reference: stage -> [batch, ...]) not compared already."""
        p = self.params[layer]
        if p.window not in self.masks:
            self.masks[p.window] = layer_mask(int(self.keep.shape[1]), p.window, self.keep)
        w_o_norms = p.w_o.T.norm(dim=1)  # |W_O[:, j]| [d_model], along the stored rows: faster
        done: set[str] = set()  # stages compared with the model's own output already
        blocks = None if self.table.padded else query_blocks(p, int(self.keep.shape[1]))
        # a few rows at a time: every intermediate of a chunk is compared while it is still in the CPU's cache
        chunks = recompute_layer(captured["x"], p, self.masks[p.window], self.chunks, self.scratch,
                                 functools.partial(self.table.needs_scores, layer), blocks)
        blocked = False
        for rows, block, rec in chunks:
            blocked |= block is not None
            done |= compare_chunk(self.table, captured, reference, w_o_norms, layer, rows, rec, block)
        if blocked:  # the model's own weights, once every block of the recompute's was compared
            for stage in (s for s in reference if reference[s] is captured[s]):
                self.table.add_same_rows(stage, "model", layer, slice(0, int(self.keep.shape[0])), captured[stage])
                done.add(stage)
        compare_with_model(self.table, layer, captured, {s: r for s, r in reference.items() if s not in done})


def compare_with_model(table: ErrorTable, layer: int, captured: dict[str, torch.Tensor],
                       reference: dict[str, torch.Tensor]) -> None:
    """One layer's captured stages against the model's own outputs (stage -> [batch, ...])."""
    for stage, ref in reference.items():
        table.add(stage, "model", layer, captured[stage], ref)


def compare_chunk(table: ErrorTable, captured: dict[str, torch.Tensor], reference: dict[str, torch.Tensor],
                  w_o_norms: torch.Tensor, layer: int, rows: slice, rec: dict[str, torch.Tensor],
                  block: tuple[int, int] | None = None) -> set[str]:
    """Every recomputed stage of some rows of one layer against the capture (the one stage dispatch: scores as
    q k^T of the captured q and k, output relative to |context| |W_O|, the rest elementwise); where the model
    returned the very tensor the capture saw, that comparison too. captured and reference: this layer's
    [batch, ...] by stage. Returns the stages compared with the model. w_o_norms: |W_O[:, j]| [d_model].
    block: the recompute attended queries a..b over keys 0..b (verify.recompute.recompute_layer; no scores)."""
    if block is not None:
        _compare_block(table, captured, w_o_norms, layer, rows, rec, block)
        return set()
    done = set()
    attended = "weights" in rec  # a chunk's attention, not the layer's projections
    for stage in (s for s in RECOMPUTED_STAGES if s in rec or (s == "scores" and attended)):
        if stage == "scores":  # the trace's scores are q k^T of its q and k
            table.add_scores(layer, rows, captured["q"][rows], captured["k"][rows], rec.get(stage))
            continue
        ours = captured[stage]
        if stage == "output":
            table.add_output(layer, rows, captured["context"][rows], w_o_norms, ours[rows], rec[stage])
        else:
            own = stage not in PROJECTED_STAGES  # q, k, v are every row's, read again by the attention
            table.add_rows(stage, "recompute", layer, rows, ours[rows], rec[stage], disposable=own)
        if reference.get(stage) is ours:
            table.add_same_rows(stage, "model", layer, rows, ours[rows])
            done.add(stage)
    return done


def _compare_block(table: ErrorTable, captured: dict[str, torch.Tensor], w_o_norms: torch.Tensor, layer: int,
                   rows: slice, rec: dict[str, torch.Tensor], block: tuple[int, int]) -> None:
    """compare_chunk for a block of queries a..b: its weights [rows, head, b - a, b] against the captured ones
    there and the captured weights past key b against the softmax's 0 the mask gave them; its context and output
    against the captured rows a..b. Each joins the layer's errors (the max over the blocks)."""
    a, b = block
    table.add_scores(layer, rows, captured["q"][rows], captured["k"][rows], None)  # q and k were found equal
    weights = captured["weights"][rows]
    table.add_rows("weights", "recompute", layer, rows, weights[:, :, a:b, :b], rec["weights"], disposable=True,
                   part=True)
    table.add_hidden("weights", layer, rows, weights[:, :, a:b, b:])
    context = captured["context"][rows][:, :, a:b]  # [rows, head, b - a, d_head]
    table.add_rows("context", "recompute", layer, rows, context, rec["context"], disposable=True, part=True)
    table.add_output(layer, rows, context, w_o_norms, captured["output"][rows][:, a:b], rec["output"], part=True)


__all__ = ["PER_HEAD", "PER_KV_HEAD", "PER_LAYER", "RELATIVE", "TOLERANCE", "CheckReport", "Comparison", "ErrorTable",
           "LayerCheck", "report_from_dict", "verify_batch"]
