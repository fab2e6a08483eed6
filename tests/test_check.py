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


def _scores_errors(q: torch.Tensor, k: torch.Tensor, rec_q: torch.Tensor, rec_k: torch.Tensor,
                   rec_scores: torch.Tensor, fused: bool) -> np.ndarray:
    table = ErrorTable(torch.ones(ROWS, TOKENS), n_layers=1, n_heads=HEADS)
    if fused:
        table.add_scores(0, slice(0, ROWS), q, k, rec_scores, rec_q, rec_k)
    else:
        table.add_scores(0, slice(0, ROWS), q, k, rec_scores)
    return table.errors[("scores", "recompute")][:, 0]  # [rows, head]


def test_the_one_product_scores_comparison_measures_the_plain_one() -> None:
    q, k, _ = _qk(scale=3.0)  # every |q_i| |k_j| above 1: the one-product path
    g = torch.Generator().manual_seed(1)
    rec_q = q + torch.randn(q.shape, generator=g) * 1e-4  # a recompute off by about 1e-4 relative
    rec_k = k.clone()
    rec_scores = rec_q @ rec_k.repeat_interleave(2, dim=1).transpose(-1, -2)
    plain = _scores_errors(q, k, rec_q, rec_k, rec_scores, fused=False)
    fused = _scores_errors(q, k, rec_q, rec_k, rec_scores, fused=True)
    assert plain.min() > TOLERANCE  # the difference is real: both fail
    np.testing.assert_allclose(fused, plain, rtol=1e-3, atol=1e-7)


def test_equal_scores_pass_and_a_wrong_key_head_fails() -> None:
    q, k, scores = _qk(scale=3.0)
    same = _scores_errors(q, k, q.clone(), k.clone(), scores, fused=True)
    assert same.max() < TOLERANCE / 10  # only the product's own rounding
    off = k.clone()
    off[1, 0, 2, 3] += 0.5  # one key of k/v head 0 in row 1: query heads 0 and 1 read it
    errors = _scores_errors(q, k, q, off, q @ off.repeat_interleave(2, dim=1).transpose(-1, -2), fused=True)
    assert (errors[1, :2] > TOLERANCE).all() and errors[0].max() < TOLERANCE and errors[1, 2:].max() < TOLERANCE


def test_small_norms_take_the_plain_path_bit_for_bit() -> None:
    q, k, scores = _qk(scale=0.1)  # |q_i| |k_j| below 1: the bound is 1, not the product
    rec_scores = scores + 1e-6
    plain = _scores_errors(q, k, q, k, rec_scores, fused=False)
    fused = _scores_errors(q, k, q, k, rec_scores, fused=True)
    np.testing.assert_array_equal(fused, plain)
    assert plain.max() > 0.0


def test_nan_in_q_is_never_lost() -> None:
    q, k, scores = _qk(scale=3.0)
    bad = q.clone()
    bad[0, 3, 1, 0] = float("nan")
    errors = _scores_errors(bad, k, q, k, scores, fused=True)
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
