"""Masks -> modified inputs -> the model's measure, batched, through the attribution objective.

One flag for every method of a run: `delete` (a removed token is taken out and the rest close up, positions
shift: Objective.score_edits with keep=False) or `replace` (its id becomes the baseline token, [MASK] where the
tokenizer has one, else its pad, else end-of-text: attribution.leave_one_out.baseline_id). Special tokens
([CLS], [SEP], BOS, a decoder's start token) are never removed, and neither are a causal target's own prefix
tokens or an encoder-decoder's decoder input: only the text's tokens are removable.

The measure of an input is the objective summed over its targets (a causal LM's log-probability of the whole
target; one target by default: the greedy next token), and an attribution's scores are summed over targets the
same way. Deleting every text token of a causal LM without a BOS would leave nothing to predict from, so then
every modified input keeps at least one text token (metrics.Example.min_kept = 1).

Check (`unperturbed_error`): the empty mask, scored in a batch beside modified inputs, against the model's own
forward from ids (Objective.reference): |a - b| / max(1, |b|) <= TOLERANCE (1e-5, float32: rows of a padded
batch of other lengths are computed by other matmul shapes, so they round differently; not bit for bit).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

# baseline_id is moving from leave_one_out (which keeps importing it) to objective: this import works in both
from attnscope.attribution.leave_one_out import baseline_id  # type: ignore[attr-defined,unused-ignore]
from attnscope.attribution.objective import CAUSAL, Objective
from attnscope.errors import AttnscopeError
from attnscope.faithfulness.metrics import Example
from attnscope.records.check_report import TOLERANCE

DELETE, REPLACE = "delete", "replace"
REMOVALS = (DELETE, REPLACE)


def check_removal(removal: str) -> str:
    if removal not in REMOVALS:
        raise AttnscopeError(f"unknown removal {removal!r}: use delete (the token taken out) or replace (the "
                             "baseline token in its place)", parameter="removal")
    return removal


@dataclass(eq=False)
class Perturber:
    """The measure of one objective under masks, by one removal."""

    objective: Objective
    removal: str
    edit_tokens: int = 4096  # token rows per batched forward
    forwards: int = 0  # modified inputs scored so far

    def __post_init__(self) -> None:
        check_removal(self.removal)

    def _text_end(self) -> int:
        """Where the text's tokens end: after it come a causal target's prefix or the decoder's input."""
        obj = self.objective
        return obj.positions[0] + 1 if obj.kind == CAUSAL else obj.n_source

    @property
    def removable(self) -> np.ndarray:
        """[token] bool: the text's tokens that are not special."""
        out = ~self.objective.special.numpy()
        out[self._text_end():] = False
        return out

    @property
    def anchor(self) -> int:
        """The position baseline's anchor: the predicting position (causal), else the last token."""
        obj = self.objective
        return obj.positions[0] if obj.kind == CAUSAL else obj.n_source - 1

    def example(self) -> Example:
        """The metrics' view of the input: removable tokens, f(x) from the model's own forward, min_kept."""
        removable = self.removable
        empty_ok = self.removal == REPLACE or bool((~removable[:self._text_end()]).any())  # a special stays
        return Example(removable=removable, full=float(self.objective.reference.double().sum()),
                       min_kept=0 if empty_ok else 1)

    def measure(self, keep: np.ndarray) -> np.ndarray:
        """keep [variant, token] bool -> [variant] float64: the objective summed over targets."""
        rows = self.scores(keep)  # [variant, target]
        if not np.isfinite(rows).all():
            raise AttnscopeError("the model's measure of a modified input is not finite (a target left with "
                                 "nothing to predict it from?): use --removal replace")
        out: np.ndarray = rows.sum(axis=1)
        return out

    def scores(self, keep: np.ndarray) -> np.ndarray:
        """keep [variant, token] bool -> [variant, target] float64 (the objective's rows, NaN left as NaN)."""
        obj = self.objective
        if (~keep[:, ~self.removable]).any():
            raise AttnscopeError("a mask removes a token that is not removable (special, or not the text's)")
        mask = torch.from_numpy(np.ascontiguousarray(keep))
        self.forwards += int(keep.shape[0])
        if self.removal == DELETE:
            rows = self._by_length(mask)
        else:
            ids = obj.ids.expand(keep.shape[0], -1).clone()  # [variant, token]
            ids[~mask] = baseline_id(obj.model)
            rows = obj.score_edits(torch.ones_like(mask), ids, rows_tokens=self.edit_tokens)
        out: np.ndarray = rows.cpu().numpy()
        return out

    def _by_length(self, mask: torch.Tensor) -> torch.Tensor:
        """mask [variant, token] -> [variant, target]: the deleted variants scored in groups of one kept length,
        so no row is padded (a curve's rows run from every token to one: padded to the longest, about half of
        the batch's work was padding; the bench measured 1.57x the plain forwards of the same inputs)."""
        kept = mask.sum(dim=1)  # [variant]
        parts = [(rows, self.objective.score_edits(mask[rows], rows_tokens=self.edit_tokens))
                 for rows in (torch.nonzero(kept == n).flatten() for n in torch.unique(kept))]
        out = torch.empty(mask.shape[0], parts[0][1].shape[1], dtype=parts[0][1].dtype)
        for rows, values in parts:
            out[rows] = values
        return out

    def unperturbed_error(self, batch_with: np.ndarray | None = None) -> float:
        """max |f(empty mask) - f(x)| / max(1, |f(x)|) over targets, the empty mask scored in a batch with
        batch_with [variant, token] (default: alone)."""
        n = self.objective.n_tokens
        keep = np.ones((1, n), dtype=bool) if batch_with is None else np.concatenate([np.ones((1, n), bool),
                                                                                         batch_with])
        row = self.scores(keep)[0]  # [target]
        own = self.objective.reference.double().cpu().numpy()
        return float((np.abs(row - own) / np.maximum(1.0, np.abs(own))).max())


def verified(error: float) -> bool:
    return error <= TOLERANCE
