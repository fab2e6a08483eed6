"""Dependency-head accuracy on hand-built word maps, both directions, and the fixed-offset baseline."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
import torch

import attnscope
from attnscope.capture import AttentionCall, recording
from attnscope.stats.batching import make_batch, tokenize
from attnscope.stats.sources import Source
from attnscope.stats.syntax import (
    OFFSETS,
    SyntaxBatch,
    SyntaxCounts,
    best_heads,
    fold_layers,
    layer_correct,
    syntax_batch,
)


def test_predictions_in_both_directions() -> None:
    # units: [CLS] w0 w1 w2 [SEP]; gold: w0 <- w1 (det), w2 <- w1 (obj); w1 is root (not scored)
    maps = torch.tensor([[[
        [0.9, 0.0, 0.1, 0.0, 0.0],
        [0.0, 0.1, 0.8, 0.1, 0.0],  # w0 attends most to w1 (its head): dep->head right
        [0.0, 0.5, 0.1, 0.1, 0.3],  # w1 attends most to w0 among words (not [SEP], not itself)
        [0.0, 0.3, 0.3, 0.4, 0.0],  # w2: w0 and w1 tie, the first (w0) wins: dep->head wrong
        [0.2, 0.2, 0.2, 0.2, 0.2],
    ]]], dtype=torch.float32)
    sb = SyntaxBatch(
        gold=torch.tensor([[-1, 2, -1, 2, -1]]),
        relation=torch.tensor([[[0, 0], [1, 0], [0, 0], [0, 1], [0, 0]]], dtype=torch.float64),
        candidates=torch.tensor([[False, True, True, True, False]]),
        names=["det", "obj"],
    )
    got = layer_correct(maps, sb)  # [direction, head, relation]
    # dep->head: det right, obj wrong. head->dep: column w0 is attended most by w1 (right);
    # in column w2, w0 and w1 tie at 0.1 and the first (w0) wins, so obj is wrong.
    assert got[0, 0].tolist() == [1.0, 0.0]
    assert got[1, 0].tolist() == [1.0, 0.0]
    counts = SyntaxCounts(1, 1, total={"det": 1, "obj": 1},
                          correct={n: np.zeros((2, 1, 1), dtype=np.int64) for n in ("det", "obj")},
                          offset_correct={n: np.zeros(len(OFFSETS), dtype=np.int64) for n in ("det", "obj")})
    counts.offset_correct["det"][OFFSETS.index(1)] = 1
    fold_layers(counts, [got], sb)
    best = {r["relation"]: r for r in best_heads(counts)}
    assert best["det"]["accuracy"] == 1.0 and best["det"]["direction"] == "dep->head"
    assert best["det"]["baseline_offset"] == 1 and best["det"]["baseline_accuracy"] == 1.0
    assert best["all"]["count"] == 2 and best["all"]["accuracy"] == 0.5


def test_counts_merge_by_relation() -> None:
    a = SyntaxCounts(1, 2)
    a.relation("det")
    a.total["det"] = 3
    a.correct["det"][0, 0, 1] = 2
    b = SyntaxCounts(1, 2)
    b.relation("nsubj")
    b.total["nsubj"] = 1
    merged = a.merge(b)
    assert merged.total == {"det": 3, "nsubj": 1}
    assert merged.to_dict() == b.merge(a).to_dict()
    assert SyntaxCounts.from_dict(merged.to_dict()).to_dict() == merged.to_dict()


def first_argmax_counts(word: torch.Tensor, sb: SyntaxBatch) -> np.ndarray:
    """layer_correct written out plainly: per scored dependent, head and direction, the first word
    (not itself, not a special token) with the largest value, compared with the gold head."""
    w = word.numpy()
    counts = np.zeros((2, w.shape[1], len(sb.names)), dtype=np.int64)
    for b, i in zip(*np.nonzero(sb.gold.numpy() >= 0), strict=True):
        allowed = [j for j in range(w.shape[-1]) if bool(sb.candidates[b, j]) and j != i]
        relation = int(np.argmax(sb.relation[b, i].numpy()))
        for head in range(w.shape[1]):
            for direction, values in enumerate((w[b, head, i, :], w[b, head, :, i])):
                best = max(values[j] for j in allowed)
                predicted = next(j for j in allowed if values[j] == best)
                counts[direction, head, relation] += predicted == int(sb.gold[b, i])
    return counts


@pytest.fixture(scope="module")
def ud_word_maps(minilm: attnscope.Model, ud_dev: Path) -> tuple[list[torch.Tensor], SyntaxBatch]:
    """Every layer's word-level maps of 16 real UD sentences in one padded batch, and their gold trees."""
    tok = minilm.tokenizer
    docs = list(itertools.islice(Source(str(ud_dev)), 16))
    batch = make_batch(tokenize(tok, docs, 256), int(tok.pad_token_id), False, False,
                       tok.cls_token_id, tok.sep_token_id, 256)
    assert batch.word_maps is not None
    captured = []

    class Keep:
        def on_attention(self, call: AttentionCall) -> None:
            captured.append(batch.word_maps.apply(call.weights))  # type: ignore[union-attr]

    with torch.inference_mode(), recording(minilm.model, Keep()):
        minilm.model(**batch.inputs)
    return captured, syntax_batch(batch.docs, batch.word_maps, SyntaxCounts(minilm.n_layers, minilm.n_heads))


def test_layer_correct_is_the_first_argmax_on_real_maps(ud_word_maps: tuple[list[torch.Tensor], SyntaxBatch]) -> None:
    layers, sb = ud_word_maps
    for word in layers:
        assert np.array_equal(layer_correct(word, sb).numpy(), first_argmax_counts(word, sb))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_layer_correct_breaks_ties_like_the_first_argmax(ud_word_maps: tuple[list[torch.Tensor], SyntaxBatch],
                                                          dtype: torch.dtype) -> None:
    _, sb = ud_word_maps
    b, n = sb.gold.shape
    torch.manual_seed(0)
    word = (torch.rand(b, 3, n, n) * 4).floor().to(dtype) / 4  # 5 distinct values: ties everywhere, zeros too
    assert np.array_equal(layer_correct(word, sb).numpy(), first_argmax_counts(word, sb))
