"""The engine against attnscope.trace, and invariance to batching, bucketing and padding."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import attnscope
from attnscope.errors import AttnscopeError
from attnscope.stats import Document, Settings, Source, process_documents
from attnscope.stats.state import StatsState

TRACE_TOL = 1e-6  # same model, same tokens: float32 maps, float64 statistics
INVARIANCE_TOL = 1e-6
TEXTS = ["The quick brown fox, unsurprisingly, jumps over the lazy dog.", "Tokenization isn't trivial."]


def unit_groups(tr: attnscope.Trace, word_level: bool) -> list[list[int]]:
    if not word_level:
        return [[t.index] for t in tr.tokens]
    groups: dict[object, list[int]] = {}
    for t in tr.tokens:
        groups.setdefault(("t", t.index) if t.word is None else ("w", t.word), []).append(t.index)
    return list(groups.values())


def reference(tr: attnscope.Trace, word_level: bool = False) -> dict[str, np.ndarray]:
    """Clark et al.'s definitions written out plainly on one traced document: [layer, head] per metric."""
    groups = unit_groups(tr, word_level)
    n_tok, n = tr.n_tokens, len(groups)
    f = np.zeros((n, n_tok))
    g = np.zeros((n_tok, n))
    for u, tokens in enumerate(groups):
        f[u, tokens] = 1.0 / len(tokens)
        g[tokens, u] = 1.0
    maps = f @ tr.weights.astype(np.float64) @ g  # [layer, head, unit, unit]

    def text(tokens: list[int]) -> str:
        first, last = tr.tokens[tokens[0]], tr.tokens[tokens[-1]]
        return "" if first.special else tr.text[first.start:last.end].strip()

    special = [len(t) == 1 and tr.tokens[t[0]].special for t in groups]
    causal = tr.causal
    kinds = {
        "cls": [s and tr.tokens[t[0]].text == "[CLS]" and not causal for s, t in zip(special, groups, strict=True)],
        "sep": [s and tr.tokens[t[0]].text == "[SEP]" and not causal for s, t in zip(special, groups, strict=True)],
        "punct": [not s and text(t) in (".", ",") for s, t in zip(special, groups, strict=True)],
        "sink": [causal and u == 0 for u in range(n)],
    }
    rows = list(range(1, n)) if causal else list(range(n))
    out: dict[str, np.ndarray] = {k: np.zeros(maps.shape[:2]) for k in
                                  ["cls", "sep", "sink", "punct", "self", "prev", "next", "entropy",
                                   "entropy_uniform", "entropy_cls", "distance", "concentration"]}
    for layer, head in itertools.product(range(maps.shape[0]), range(maps.shape[1])):
        a = maps[layer, head]
        for kind, on in kinds.items():
            out[kind][layer, head] = np.mean([sum(a[i, j] for j in range(n) if on[j]) for i in rows])
        out["self"][layer, head] = np.mean([a[i, i] for i in rows])
        out["prev"][layer, head] = np.mean([a[i, i - 1] if i > 0 else 0.0 for i in rows])
        out["next"][layer, head] = np.mean([a[i, i + 1] if i + 1 < n else 0.0 for i in rows])
        ent = [-sum(p * math.log(p) for p in a[i] if p > 0) for i in range(n)]
        out["entropy"][layer, head] = np.mean([ent[i] for i in rows])
        out["entropy_uniform"][layer, head] = np.mean([math.log(i + 1 if causal else n) for i in rows])
        out["entropy_cls"][layer, head] = ent[0]
        out["distance"][layer, head] = np.mean([sum(a[i, j] * abs(i - j) for j in range(n)) for i in rows])
        out["concentration"][layer, head] = np.mean([a[i].max() for i in rows])
    return out


def compare(state: StatsState, expected: dict[str, np.ndarray], tol: float) -> None:
    """tol bounds the error of a weight; distance, sum_j A[i,j] |i - j|, multiplies each by up to n - 1 tokens
    (the engine pads a document to its bucket, so its float32 weights may differ from the trace's by an ulp)."""
    for name in state.metrics:
        got = state.mean(name)
        bound = tol * max(1, state.tokens - 1) if name == "distance" else tol
        assert np.abs(got - expected[name]).max() <= bound, name
        assert (state.count[name] == 1).all(), name


@pytest.mark.parametrize("word_level", [False, True])
def test_one_document_equals_its_trace(minilm: attnscope.Model, word_level: bool) -> None:
    for text in TEXTS:
        state = process_documents(minilm, [Document(text, "t")], Settings(word_level=word_level))
        tr = attnscope.trace(text, model=minilm)
        assert state.tokens == tr.n_tokens and state.documents == 1
        compare(state, reference(tr, word_level), TRACE_TOL)


def test_one_document_equals_its_trace_causal(tiny_model: Callable[[str], attnscope.Model]) -> None:
    gpt2 = tiny_model("gpt2")
    state = process_documents(gpt2, [Document(TEXTS[0], "t")], Settings())
    assert "sink" in state.metrics and "cls" not in state.metrics and "entropy_cls" not in state.metrics
    compare(state, reference(attnscope.trace(TEXTS[0], model=gpt2)), TRACE_TOL)


@pytest.fixture(scope="module")
def ud_docs(ud_dev: Path) -> list[Document]:
    return list(itertools.islice(Source(str(ud_dev)), 24))


def test_batching_bucketing_and_padding_do_not_change_numbers(minilm: attnscope.Model,
                                                              ud_docs: list[Document]) -> None:
    runs = [
        Settings(batch_size=1),  # no padding at all
        Settings(batch_size=5, chunk_batches=2),  # small buckets
        Settings(batch_size=64, cell_budget=10**9),  # one padded batch of everything
    ]
    states = [process_documents(minilm, ud_docs, s) for s in runs]
    first = states[0]
    for other in states[1:]:
        assert other.documents == first.documents == 24 and other.tokens == first.tokens
        for name in first.metrics:
            assert np.abs(other.mean(name) - first.mean(name)).max() <= INVARIANCE_TOL, name
            assert np.abs(other.std(name) - first.std(name)).max() <= INVARIANCE_TOL, name
            assert np.array_equal(other.count[name], first.count[name]), name
        assert first.syntax is not None and other.syntax is not None
        assert other.syntax.to_dict() == first.syntax.to_dict()


def test_merged_halves_equal_the_whole(minilm: attnscope.Model, ud_docs: list[Document]) -> None:
    settings = Settings(batch_size=8)
    whole = process_documents(minilm, ud_docs, settings)
    halves = process_documents(minilm, ud_docs[12:], settings).merge(
        process_documents(minilm, ud_docs[:12], settings))
    assert halves.documents == whole.documents and halves.tokens == whole.tokens
    for name in whole.metrics:
        assert np.abs(halves.mean(name) - whole.mean(name)).max() <= INVARIANCE_TOL, name


def test_word_level_syntax_uses_gold_words(minilm: attnscope.Model, ud_docs: list[Document]) -> None:
    token = process_documents(minilm, ud_docs[:12], Settings())
    word = process_documents(minilm, ud_docs[:12], Settings(word_level=True))
    assert token.syntax is not None and word.syntax is not None
    assert token.syntax.to_dict() == word.syntax.to_dict()  # syntax is word-level either way
    scored = sum(token.syntax.total.values())
    words = sum(len(d.words or ()) for d in ud_docs[:12])
    roots = sum(h == 0 for d in ud_docs[:12] for h in d.heads or ())
    assert scored == words - roots


def test_truncation_is_counted_or_refused(minilm: attnscope.Model) -> None:
    docs = [Document("word " * 40, "long"), Document("short one", "short")]
    state = process_documents(minilm, docs, Settings(max_length=16))
    assert state.truncated == 1 and state.tokens == 16 + 4
    with pytest.raises(AttnscopeError, match="long: the document is over 16 tokens"):
        process_documents(minilm, docs, Settings(max_length=16, truncate=False))
    with pytest.raises(AttnscopeError, match="exceeds what"):
        process_documents(minilm, docs, Settings(max_length=100_000))


def test_a_metric_with_its_own_input_plugs_in(minilm: attnscope.Model) -> None:
    """A new per-batch input and a metric reading it run without touching the engine: the run's settings
    name their set, and nothing outside the run changes."""
    from attnscope.stats import BUILTIN_METRICS, Metric, MetricSet
    from attnscope.stats.metrics import attention_to

    before = dict(BUILTIN_METRICS)
    doubled = MetricSet("doubled", (Metric("cls_doubled", attention_to("cls"), "twice the attention to [CLS]",
                                           "doubled"),), (("doubled", lambda view: 2 * view.call.weights),))
    orphan = MetricSet("orphan", (Metric("orphan", attention_to("cls"), "reads a map nobody provides", "missing"),))
    docs = [Document(TEXTS[1], "t")]
    with pytest.raises(AttnscopeError, match="'orphan' reads the map 'missing'"):
        process_documents(minilm, docs, Settings(metric_sets=(doubled, orphan)))
    state = process_documents(minilm, docs, Settings(metric_sets=(doubled,)))
    assert np.abs(state.mean("cls_doubled") - 2 * state.mean("cls")).max() <= 1e-9
    assert "cls_doubled" not in process_documents(minilm, docs, Settings()).metrics  # for that run only
    assert dict(BUILTIN_METRICS) == before
