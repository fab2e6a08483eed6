"""Hand-made heads with known patterns (previous token, first token, uniform) for the head-grouping tests."""

from __future__ import annotations

import numpy as np

from attnscope.corpus.head_sums import HeadSums, add_sentence

KINDS = ("previous", "first", "uniform")


def hand_made(kind: str, n: int, causal: bool, rng: np.random.Generator) -> np.ndarray:
    """A head's [query, key] map of n tokens, exactly of one kind (plus a little noise on a share of 0.05)."""
    w = np.zeros((n, n))
    t = np.arange(n)
    if kind == "previous":
        w[t, np.maximum(t - 1, 0)] = 1.0
    elif kind == "first":
        w[:, 0] = 1.0
    else:
        w[:] = 1.0
    allowed = np.tril(np.ones((n, n))) if causal else np.ones((n, n))
    noise = rng.random((n, n)) * allowed
    w = 0.95 * (w * allowed) / (w * allowed).sum(-1, keepdims=True) + 0.05 * noise / noise.sum(-1, keepdims=True)
    return w


def hand_made_sums(causal: bool, copies: int = 3, seed: int = 0) -> HeadSums:
    """One layer of 3 * copies heads (previous-token, first-token and uniform, `copies` of each) over 12 sentences."""
    rng = np.random.default_rng(seed)
    sums = HeadSums(layers=1, heads=len(KINDS) * copies)
    for n in range(6, 18):
        p = np.stack([hand_made(kind, n, causal, rng) for kind in KINDS for _ in range(copies)])
        special = np.zeros(n, dtype=bool)
        add_sentence(sums, p, special, causal)
    return sums
