"""The check's fast comparisons measure what the plain ones measure, and a real difference still fails."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnscope.records.check_report import TOLERANCE
from attnscope.verify.check import ErrorTable

ROWS, HEADS, KV_HEADS, TOKENS, D_HEAD = 2, 4, 2, 6, 8


def _qk(scale: float, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q [rows, head, token, d_head], k [rows, kv_head, token, d_head] (grouped), and the scores q k^T."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(ROWS, HEADS, TOKENS, D_HEAD, generator=g) * scale
    k = torch.randn(ROWS, KV_HEADS, TOKENS, D_HEAD, generator=g) * scale
    scores = q @ k.repeat_interleave(HEADS // KV_HEADS, dim=1).transpose(-1, -2)  # [rows, head, query, key]
    return q, k, scores


def _scores_errors(q: torch.Tensor, k: torch.Tensor, recomputed: torch.Tensor,
                   rec: tuple[torch.Tensor, torch.Tensor] | None, keep: torch.Tensor | None = None) -> np.ndarray:
    """[rows, head] errors of the scores; with rec (the recomputed q and k) compared first, as verify_batch does."""
    keep = torch.ones(ROWS, TOKENS) if keep is None else keep
    table = ErrorTable(keep, n_layers=1, n_heads=HEADS)
    rows = slice(0, ROWS)
    if rec is not None:
        table.add_rows("q", "recompute", 0, rows, q, rec[0])
        table.add_rows("k", "recompute", 0, rows, k, rec[1])
    table.add_scores(0, rows, q, k, recomputed)
    return table.errors[("scores", "recompute")][:, 0]


def test_equal_q_and_k_give_the_scores_comparison_its_plain_result() -> None:
    q, k, scores = _qk(scale=3.0)
    rec = (q.clone(), k.clone())  # equal numbers in other tensors, as the recompute gives them
    np.testing.assert_array_equal(_scores_errors(q, k, scores, rec), _scores_errors(q, k, scores, None))
    assert _scores_errors(q, k, scores, rec).max() == 0.0
    off = scores.clone()
    off[0, 1, 2, 3] += 1.0  # scores that are not q k^T: the shortcut would miss it, so the plain path must see it
    assert _scores_errors(q, k, off, None)[0, 1] > TOLERANCE


def test_a_different_key_takes_the_plain_comparison_and_fails() -> None:
    q, k, _ = _qk(scale=3.0)
    off = k.clone()
    off[1, 0, 2, 3] += 0.5  # one key of k/v head 0 in row 1: query heads 0 and 1 read it
    rec_scores = q @ off.repeat_interleave(HEADS // KV_HEADS, dim=1).transpose(-1, -2)
    errors = _scores_errors(q, k, rec_scores, (q, off))
    np.testing.assert_array_equal(errors, _scores_errors(q, k, rec_scores, None))
    assert (errors[1, :2] > TOLERANCE).all() and errors[0].max() == 0.0 and errors[1, 2:].max() == 0.0


def test_nan_or_infinity_in_q_is_never_lost() -> None:
    q, k, scores = _qk(scale=3.0)
    q[0, 3, 1, 0] = float("nan")
    q[1, 2, 0, 0] = float("inf")
    errors = _scores_errors(q, k, scores, (q, k))  # the very same tensors: their errors are NaN, not 0
    assert np.isnan(errors[0, 3]) and np.isnan(errors[1, 2])


def test_a_difference_in_padding_only_keeps_the_shortcut() -> None:
    """The shortcut rests on q and k alone: given equal ones (here they differ only at padded tokens), the
    recomputed scores are not formed again (zeros stand in for them and nothing is reported)."""
    keep = torch.ones(ROWS, TOKENS)
    keep[1, -2:] = 0  # row 1 ends in two padded tokens
    q, k, scores = _qk(scale=3.0)
    rec_q = q.clone()
    rec_q[1, :, -1] += 1.0  # differs only where row 1 is padded
    assert _scores_errors(q, k, torch.zeros_like(scores), (rec_q, k), keep).max() == 0.0
    rec_q[1, :, 0] += 1.0  # and now at a real token: the full comparison runs (and sees the zeros)
    assert _scores_errors(q, k, torch.zeros_like(scores), (rec_q, k), keep)[1].min() > TOLERANCE


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


def test_the_recompute_needs_no_scores_once_q_and_k_of_every_row_are_equal() -> None:
    q, k, _ = _qk(scale=3.0)
    table = ErrorTable(torch.ones(ROWS, TOKENS), n_layers=1, n_heads=HEADS)
    every = slice(0, ROWS)
    assert table.needs_scores(0)  # nothing compared yet
    table.add_rows("q", "recompute", 0, every, q, q.clone())
    table.add_rows("k", "recompute", 0, every, k, k.clone())
    assert not table.needs_scores(0)
    table.add_scores(0, slice(1, 2), q[1:2], k[1:2], None)  # a chunk without recomputed scores: 0 by equality
    assert table.errors[("scores", "recompute")][1, 0].max() == 0.0
    off = k.clone()
    off[0, 0, 0, 0] += 1.0
    table.add_rows("k", "recompute", 0, every, k, off)
    assert table.needs_scores(0)
    with pytest.raises(RuntimeError):
        table.add_scores(0, slice(0, 1), q[:1], k[:1], None)


def test_equal_numbers_are_found_without_the_subtraction_and_anything_else_is_measured() -> None:
    """add_rows' shortcut (|a - b| is 0 when b's sum is finite and a == b everywhere; for weights, a softmax's
    output in [0, 1] or NaN, a == b alone) gives the plain path's table: 0 for equal numbers, NaN for an infinity
    both hold (|inf - inf|) or a NaN, and one float32 step apart the step itself, in the head where it is."""
    w = torch.rand(ROWS, HEADS, TOKENS, TOKENS)  # [batch, head, query, key]
    keep = torch.ones(ROWS, TOKENS)

    def errors(captured: torch.Tensor, recomputed: torch.Tensor, stage: str = "weights") -> np.ndarray:
        table = ErrorTable(keep, n_layers=1, n_heads=HEADS)
        table.add_rows(stage, "recompute", 0, slice(0, ROWS), captured, recomputed.clone())
        return table.errors[(stage, "recompute")][:, 0]

    for stage in ("weights", "q"):
        assert errors(w, w.clone(), stage).max() == 0.0
        step = w.clone()
        step[1, 3, 2, 4] = torch.nextafter(step[1, 3, 2, 4], torch.tensor(2.0))
        got = errors(w, step, stage)
        assert got[1, 3] == float(step[1, 3, 2, 4] - w[1, 3, 2, 4]) > 0.0 and got[0].max() == got[1, :3].max() == 0.0
    # the same bits on both sides: NaN in any stage; an infinity only where it is not a softmax's output
    for stage, bad in (("weights", float("nan")), ("q", float("nan")), ("q", float("inf"))):
        odd = w.clone()
        odd[0, 2, 1, 1] = bad
        got = errors(odd, odd.clone(), stage)
        assert np.isnan(got[0, 2]) and np.isnan(got).sum() == 1, (stage, bad)
    table = ErrorTable(keep, n_layers=1, n_heads=HEADS)  # a model's own weights are not our softmax's output
    odd = w.clone()
    odd[0, 2, 1, 1] = float("inf")
    table.add_rows("weights", "model", 0, slice(0, ROWS), odd, odd.clone())
    got = table.errors[("weights", "model")][:, 0]
    assert np.isnan(got[0, 2]) and np.isnan(got).sum() == 1
    odd = w.clone()
    odd[0, 2, 1, 1] = float("inf")  # captured weights no softmax gives: the recomputed ones differ there
    got = errors(odd, w, "weights")
    assert got[0, 2] == float("inf") and np.isfinite(got).sum() == got.size - 1


def test_head_error_names_the_range_and_keeps_nan() -> None:
    from attnscope.errors import AttnscopeError
    from attnscope.records.check_report import CheckReport, Comparison

    weights = np.zeros((2, 3))  # [layer, head]
    weights[1, 2] = np.nan
    output = np.full((2, 1), 1e-7)  # per layer: counts for every head
    report = CheckReport(TOLERANCE, [Comparison("output", "recompute", output), Comparison("weights", "recompute",
                                                                                          weights)])
    assert report.head_error(0, 2) == 1e-7 and np.isnan(report.head_error(1, 2))  # NaN after a number still shows
    for layer, head, message in ((2, 0, "layer 2 is out of range"), (-1, 0, "layer -1 is out of range"),
                                 (0, 3, "head 3 is out of range: this check has 3 heads")):
        with pytest.raises(AttnscopeError, match=message):
            report.head_error(layer, head)
