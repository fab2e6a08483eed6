"""The check's fast comparisons measure what the plain ones measure, and a real difference still fails."""

from __future__ import annotations

import numpy as np
import torch

from attnscope.check import ErrorTable
from attnscope.report import TOLERANCE

ROWS, HEADS, KV_HEADS, TOKENS, D_HEAD = 2, 4, 2, 6, 8


def _qk(scale: float, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q [rows, head, token, d_head], k [rows, kv_head, token, d_head] (grouped), and the scores q k^T."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(ROWS, HEADS, TOKENS, D_HEAD, generator=g) * scale
    k = torch.randn(ROWS, KV_HEADS, TOKENS, D_HEAD, generator=g) * scale
    scores = q @ k.repeat_interleave(HEADS // KV_HEADS, dim=1).transpose(-1, -2)  # [rows, head, query, key]
    return q, k, scores


def _scores_errors(q: torch.Tensor, k: torch.Tensor, recomputed: torch.Tensor,
                   rec: tuple[torch.Tensor, torch.Tensor] | None) -> np.ndarray:
    """[rows, head] errors of the scores: given rec (the recomputed q and k), with the shortcut for equal ones."""
    table = ErrorTable(torch.ones(ROWS, TOKENS), n_layers=1, n_heads=HEADS)
    table.add_scores(0, slice(0, ROWS), q, k, recomputed, *(rec or (None, None)))
    return table.errors[("scores", "recompute")][:, 0]


def test_equal_q_and_k_give_the_scores_comparison_its_plain_result() -> None:
    q, k, scores = _qk(scale=3.0)
    rec = (q.clone(), k.clone())  # equal numbers in other tensors, as the recompute gives them
    np.testing.assert_array_equal(_scores_errors(q, k, scores, rec), _scores_errors(q, k, scores, None))
    assert _scores_errors(q, k, scores, rec).max() == 0.0


def test_a_different_key_takes_the_plain_comparison_and_fails() -> None:
    q, k, _ = _qk(scale=3.0)
    off = k.clone()
    off[1, 0, 2, 3] += 0.5  # one key of k/v head 0 in row 1: query heads 0 and 1 read it
    rec_scores = q @ off.repeat_interleave(HEADS // KV_HEADS, dim=1).transpose(-1, -2)
    errors = _scores_errors(q, k, rec_scores, (q, off))
    np.testing.assert_array_equal(errors, _scores_errors(q, k, rec_scores, None))
    assert (errors[1, :2] > TOLERANCE).all() and errors[0].max() == 0.0 and errors[1, 2:].max() == 0.0


def test_a_nan_in_q_is_never_lost() -> None:
    q, k, scores = _qk(scale=3.0)
    q[0, 3, 1, 0] = float("nan")
    errors = _scores_errors(q, k, scores, (q, k))  # the very same tensors: NaN != NaN, so compared in full
    assert np.isnan(errors[0, 3]) and not np.isnan(errors[1]).any()


def test_the_models_own_weights_compared_after_the_recompute_equal_the_plain_comparison() -> None:
    """add_same_rows (after the recompute) gives what add gives for the very same tensor: 0, NaN where a real
    position is NaN or infinite, padding ignored."""
    keep = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    w = torch.rand(2, 3, 4, 4)  # [batch, head, query, key]
    rec = w.clone()
    w[0, 1, 2, 0] = float("nan")
    w[1, 2, 0, 1] = float("inf")
    w[0, 2, 3, 3] = float("nan")  # padding: ignored
    plain, fast = ErrorTable(keep, n_layers=1, n_heads=3), ErrorTable(keep, n_layers=1, n_heads=3)
    plain.add("weights", "model", 0, w, w)
    for rows in (slice(0, 1), slice(1, 2)):
        fast.add_rows("weights", "recompute", 0, rows, w[rows], rec[rows])
        fast.add_same_rows("weights", "model", 0, rows, w[rows])
    np.testing.assert_array_equal(fast.errors[("weights", "model")], plain.errors[("weights", "model")])
    assert np.isnan(plain.errors[("weights", "model")][:, 0]).tolist() == [[False, True, False], [False, False, True]]
