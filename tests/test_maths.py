"""The from-scratch maths against PyTorch's own attention implementations and a hand-worked example."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from attnscope import maths
from attnscope.explain.toy import toy_stages
from attnscope.stages import OPTIONAL_STAGES, STAGES

TOL = 1e-5


def _qkv(batch: int = 2, heads: int = 3, n: int = 7, d: int = 8, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(batch, heads, n, d, generator=g) for _ in range(3))


def test_attention_matches_sdpa_without_mask() -> None:
    q, k, v = _qkv()
    context, weights = maths.attention(q, k, v)
    assert torch.allclose(weights.sum(-1), torch.ones(2, 3, 7), atol=TOL)
    assert (context - F.scaled_dot_product_attention(q, k, v)).abs().max() <= TOL


def test_attention_matches_sdpa_with_padding_and_causal_masks() -> None:
    q, k, v = _qkv()
    keep = torch.tensor([[1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0, 0]])
    pad = maths.padding_mask(keep)[:, None]  # [batch, 1, 1, key]
    mask = maths.combine_masks(pad, maths.causal_mask(7))
    context, weights = maths.attention(q, k, v, mask)
    allowed = keep.bool()[:, None, None, :] & torch.ones(7, 7, dtype=torch.bool).tril()
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
    assert (context - ref).abs().max() <= TOL
    assert weights[1, :, :, 4:].abs().max() == 0.0  # padded keys get exactly zero weight
    assert torch.triu(weights, 1).abs().max() == 0.0  # no weight on the future


def test_multi_head_attention_matches_torch_multihead_attention() -> None:
    torch.manual_seed(1)
    d_model, heads, n = 12, 3, 5
    mha = torch.nn.MultiheadAttention(d_model, heads, batch_first=True).eval()
    x = torch.randn(2, n, d_model)
    w_q, w_k, w_v = mha.in_proj_weight.detach().chunk(3)  # each [out, in]
    b_q, b_k, b_v = mha.in_proj_bias.detach().chunk(3)
    params = maths.AttentionParams(w_q.T, b_q, w_k.T, b_k, w_v.T, b_v, mha.out_proj.weight.detach().T,
                                   mha.out_proj.bias.detach(), heads, (d_model // heads) ** -0.5)
    for causal in (False, True):
        mask = maths.causal_mask(n) if causal else None
        stages = maths.multi_head_attention(x, params, mask)
        bool_mask = torch.ones(n, n, dtype=torch.bool).triu(1) if causal else None
        ref_out, ref_w = mha(x, x, x, attn_mask=bool_mask, need_weights=True, average_attn_weights=False)
        assert (stages["output"] - ref_out).abs().max() <= TOL
        assert (stages["weights"] - ref_w).abs().max() <= TOL


def test_every_stage_is_returned_with_named_shapes() -> None:
    torch.manual_seed(2)
    d_model, heads, n = 8, 2, 4
    p = maths.AttentionParams(*(torch.randn(d_model, d_model) if i % 2 == 0 else torch.randn(d_model)
                                for i in range(8)), n_heads=heads, scaling=0.5)
    st = maths.multi_head_attention(torch.randn(n, d_model), p)
    assert tuple(st) == tuple(s for s in STAGES if s not in OPTIONAL_STAGES)  # no rotation, no soft-capping
    assert st["q"].shape == (heads, n, d_model // heads)  # [head, token, d_head]
    assert st["scores"].shape == (heads, n, n)  # [head, query, key]
    assert st["merged"].shape == (n, d_model)
    assert torch.equal(st["scaled"], st["scores"] * 0.5)
    assert torch.equal(maths.merge_heads(st["context"]), st["merged"])


def test_split_and_merge_heads_are_inverse() -> None:
    t = torch.arange(2 * 5 * 12, dtype=torch.float32).reshape(2, 5, 12)
    assert torch.equal(maths.merge_heads(maths.split_heads(t, 3)), t)
    assert torch.equal(maths.split_heads(t, 3)[0, 1, 2], t[0, 2, 4:8])  # head 1 of token 2 = columns 4..7


def test_toy_example_matches_the_hand_computation() -> None:
    unscaled = toy_stages(scale=False)
    # Worked by hand in the classic tutorial: Q K^T row 1 = [2, 4, 4], row 2 = [4, 16, 12], row 3 = [4, 12, 10].
    assert unscaled["scores"].tolist() == [[2, 4, 4], [4, 16, 12], [4, 12, 10]]
    assert unscaled["weights"][0].tolist() == pytest.approx([0.0634, 0.4683, 0.4683], abs=1e-4)
    assert unscaled["context"][0].tolist() == pytest.approx([1.9366, 6.6831, 1.5951], abs=1e-4)
    scaled = toy_stages(scale=True)
    assert scaled["scaled"][1, 1].item() == pytest.approx(16 / math.sqrt(3), abs=1e-12)
    assert scaled["weights"].sum(-1).tolist() == pytest.approx([1.0, 1.0, 1.0], abs=1e-12)


def test_softmax_keeps_nan_visible() -> None:
    s = torch.tensor([[0.0, float("nan"), 1.0]])
    assert torch.isnan(maths.softmax(s)).all()  # never silently replaced


def _rope_params(d_model: int = 16, heads: int = 4, kv_heads: int = 2, d_rot: int = 4,
                 **options: object) -> maths.AttentionParams:
    g = torch.Generator().manual_seed(3)
    d_head = d_model // heads
    w = [torch.randn(d_model, width, generator=g) for width in (heads * d_head, kv_heads * d_head, kv_heads * d_head)]
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, d_rot, 2, dtype=torch.float) / d_rot))
    return maths.AttentionParams(w[0], None, w[1], None, w[2], None, torch.randn(heads * d_head, d_model, generator=g),
                                 None, heads, d_head**-0.5, n_kv_heads=kv_heads, rope=maths.Rope(inv_freq),
                                 **options)  # type: ignore[arg-type]


def test_rotation_turns_each_pair_by_position_times_theta() -> None:
    p = _rope_params()
    st = maths.multi_head_attention(torch.randn(5, 16), p)
    theta = p.rope.inv_freq if p.rope else torch.empty(0)  # [d_rot / 2]
    for pos in range(5):
        for i in range(2):  # pair (i, i + 2) of the 4 rotated dims turns by pos * theta_i
            a, b = st["q_pre"][1, pos, i], st["q_pre"][1, pos, i + 2]
            angle = pos * float(theta[i])
            want = (a * math.cos(angle) - b * math.sin(angle), a * math.sin(angle) + b * math.cos(angle))
            got = (st["q"][1, pos, i], st["q"][1, pos, i + 2])
            assert abs(float(got[0] - want[0])) <= TOL and abs(float(got[1] - want[1])) <= TOL
    assert torch.equal(st["q"][..., 4:], st["q_pre"][..., 4:])  # partial rotary: dims past d_rot pass unchanged
    assert torch.equal(st["position_ids"], torch.arange(5))


def test_rotated_scores_depend_on_relative_position_only() -> None:
    p = _rope_params(d_rot=4)
    x = torch.randn(1, 16).repeat(6, 1)  # the same token at positions 0..5
    st = maths.multi_head_attention(x, p)
    s = st["scores"][0]  # [query, key]
    assert abs(float(s[3, 1] - s[5, 3])) <= 1e-4 and abs(float(s[2, 2] - s[4, 4])) <= 1e-4


def test_grouped_query_heads_read_their_kv_head() -> None:
    p = _rope_params(heads=4, kv_heads=2)
    st = maths.multi_head_attention(torch.randn(5, 16), p)
    assert st["k"].shape == (2, 5, 4) and st["v"].shape == (2, 5, 4)  # [kv_head, token, d_head], not repeated
    for h in range(4):
        want, _ = maths.attention(st["q"][h], st["k"][h // 2], st["v"][h // 2], scaling=p.scaling)
        assert (st["context"][h] - want).abs().max() <= TOL


def test_window_mask_matches_its_definition() -> None:
    n = 6
    for window in (maths.Window(None, 0), maths.Window(2, 0), maths.Window(1, 1)):
        mask = maths.window_mask(n, window)
        assert mask is not None
        for i in range(n):
            for j in range(n):
                after_start = window.before is None or j >= i - window.before
                seen = after_start and (window.after is None or j <= i + window.after)
                assert (mask[i, j] == 0) == seen
    assert maths.window_mask(n, maths.Window()) is None
    assert torch.equal(maths.window_mask(n, maths.Window(None, 0)), maths.causal_mask(n))  # type: ignore[arg-type]


def test_soft_cap_and_qk_norm_follow_their_definitions() -> None:
    norm = maths.QKNorm(torch.linspace(0.5, 2.0, 4), 1e-6, per_head=True)
    p = _rope_params(softcap=2.0, q_norm=norm, k_norm=norm)
    st = maths.multi_head_attention(torch.randn(5, 16) * 10, p)
    assert (st["capped"] - 2.0 * torch.tanh(st["scaled"] / 2.0)).abs().max() <= TOL
    assert st["capped"].abs().max() < 2.0
    raw = maths.split_heads(torch.randn(5, 16) @ p.w_q, 4)
    normed = maths.rms_norm(raw, norm)
    rms = raw.pow(2).mean(-1, keepdim=True).sqrt()
    assert (normed - raw / rms * norm.weight).abs().max() <= 1e-4


def test_in_place_and_kept_stages_give_the_same_numbers() -> None:
    p = _rope_params(softcap=3.0)
    x = torch.randn(2, 5, 16)
    mask = maths.combine_masks(maths.padding_mask(torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]))[:, None],
                               maths.causal_mask(5))
    full = maths.multi_head_attention(x, p, mask)
    lean = maths.multi_head_attention(x, p, mask, keep=("q", "weights", "output"), in_place=True)
    assert tuple(lean) == ("q", "weights", "output")
    for name, t in lean.items():
        assert torch.equal(t, full[name]), name


def test_scratch_buffers_give_the_same_numbers_and_are_reused() -> None:
    p = _rope_params()
    mask = maths.causal_mask(5)
    scratch: dict[str, torch.Tensor] = {}
    for seed in (0, 1):  # the second call writes into the first call's buffers
        x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(seed))
        full = maths.multi_head_attention(x, p, mask)
        lean = maths.multi_head_attention(x, p, mask, keep=("scores", "weights"), in_place=True, scratch=scratch)
        for name, t in lean.items():
            assert torch.equal(t, full[name]), name
    # scores, the logits (scaled and masked in place) and the weights the softmax writes
    assert len(scratch) == 3 and {t.data_ptr() for t in lean.values()} < {t.data_ptr() for t in scratch.values()}


def test_a_sink_takes_its_share_of_each_row() -> None:
    scores = torch.randn(2, 3, 4, 5)  # [batch, head, query, key]
    sinks = torch.tensor([0.0, 2.0, -1.0])  # [head]
    w = maths.softmax_with_sink(scores.clone(), sinks)
    e = scores.exp()
    want = e / (e.sum(-1, keepdim=True) + sinks.exp().view(1, 3, 1, 1))  # exp(s_j) / (sum_k exp(s_k) + exp(sink))
    assert (w - want).abs().max() <= TOL and bool((w.sum(-1) < 1.0).all())


def test_softmax_is_the_four_steps_written_out() -> None:
    """maths.softmax (torch's kernel, as the models' eager attention uses) against its definition, step by step in
    float64: the row's max, exp(s - max), their sum, the division. Masked keys (the dtype's minimum, on top of
    scores far below their row's max, whose exps are denormal), a row that sees no key (uniform) and a NaN."""
    lowest = torch.finfo(torch.float32).min
    pad = maths.padding_mask(torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]))[:, None]  # [batch, 1, 1, key]
    mask = maths.combine_masks(pad, maths.causal_mask(5))  # [batch, 1, query, key]
    scores = torch.randn(2, 3, 5, 5, generator=torch.Generator().manual_seed(0)) * 40.0  # [batch, head, query, key]
    scores[0, 0, 4, 1] = scores[0, 0, 4, 0] - 95.0  # an exp in the denormal range
    mask[0, 0, 2, :] = lowest  # query 2 of row 0 sees no key
    masked = scores + mask
    s = masked.double()
    e = (s - s.amax(-1, keepdim=True)).exp()
    want = e / e.sum(-1, keepdim=True)
    got = maths.softmax(masked)
    hidden = (mask == lowest).expand_as(got).clone()
    hidden[0, :, 2] = False  # the blind row
    assert (got.double() - want).abs().max() <= 1e-7 and bool((got[hidden] == 0).all())
    assert bool(got[0, :, 2].sub(0.2).abs().max() < 1e-6)  # the blind row: exp(0) everywhere, uniform
    masked[1, 2, 3, 0] = float("nan")
    with_nan = maths.softmax(masked)
    assert bool(with_nan[1, 2, 3].isnan().all()) and torch.equal(with_nan[1, 2, :3], got[1, 2, :3])
    buffer = torch.empty_like(masked)
    assert maths.softmax(masked, out=buffer) is buffer
    torch.testing.assert_close(buffer, with_nan, rtol=0.0, atol=0.0, equal_nan=True)


def test_scores_not_asked_for_are_formed_in_the_logits_buffer_with_the_same_numbers() -> None:
    p = _rope_params()
    mask = maths.combine_masks(maths.padding_mask(torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]))[:, None],
                               maths.causal_mask(5))
    scratch: dict[str, torch.Tensor] = {}
    x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(4))
    full = maths.multi_head_attention(x, p, mask)
    for m in (mask, None):  # scaling and mask in one pass over that buffer, or the scaling alone
        lean = maths.multi_head_attention(x, p, m, keep=("weights", "context"), in_place=True, scratch=scratch)
        want = full if m is not None else maths.multi_head_attention(x, p)
        for name, t in lean.items():
            assert torch.equal(t, want[name]), name
    assert not any(key.startswith("scores") for key in scratch)
