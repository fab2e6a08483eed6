"""The from-scratch maths against PyTorch's own attention implementations and a hand-worked example."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from attnscope import maths
from attnscope.stages import STAGES
from attnscope.toy import toy_stages

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
    assert tuple(st) == STAGES
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
