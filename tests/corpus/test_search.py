"""Search: exact search is a brute-force numpy search; the approximate index finds >= 95% of the exact top 10;
a corpus sentence finds its own token; the summary counts what the matches are."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

import attnscope
from attnscope.corpus import ann
from attnscope.corpus.query import query_vector, search
from attnscope.corpus.search import exact_search, find, vectors
from attnscope.corpus.store import CorpusIndex
from attnscope.corpus.summary import position_bin

KINDS = [("embedding", 0, None), ("embedding", 3, None), ("context", 3, None), ("query", 3, 4), ("key", 0, 1)]


def brute_force(data: np.ndarray, query: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Every cosine distance at once, in float64, sorted by (distance, row)."""
    x = np.asarray(data, dtype=np.float64)
    q = np.asarray(query, dtype=np.float64)
    distance = 1.0 - (x @ q) / (np.linalg.norm(x, axis=1) * np.linalg.norm(q))
    order = np.lexsort((np.arange(len(x)), distance))[:k]
    return order, distance[order]


@pytest.mark.parametrize(("by", "layer", "head"), KINDS)
def test_exact_search_equals_a_brute_force_numpy_search(index: CorpusIndex, by: str, layer: int,
                                                        head: int | None) -> None:
    data = vectors(index, by, layer, head)
    rng = np.random.default_rng(0)
    for row in rng.choice(index.n_tokens, 10, replace=False):
        query = np.asarray(data[row]) + rng.normal(0, 0.05, data.shape[1])
        rows, distances = exact_search(data, query, 25)
        want_rows, want = brute_force(data, query, 25)
        assert np.abs(distances - want).max() <= 1e-12
        # the same rows, except that rows with equal vectors (a [CLS] at layer 0 is the same in every sentence)
        # may come in another order: each row found is at its own brute-force distance, each once
        everything = brute_force(data, query, len(data))
        at = dict(zip(everything[0].tolist(), everything[1].tolist(), strict=True))
        assert np.abs(np.array([at[r] for r in rows.tolist()]) - distances).max() <= 1e-12
        assert len(set(rows.tolist())) == 25
        clear = want < want[-1] - 1e-9  # rows before any tie at the cut
        assert set(rows[clear].tolist()) == set(want_rows[clear].tolist())


def test_exact_search_in_chunks_equals_one_pass(index: CorpusIndex, monkeypatch: pytest.MonkeyPatch) -> None:
    data = vectors(index, "embedding", 3, None)
    whole = exact_search(data, np.asarray(data[5]), 40)
    monkeypatch.setattr("attnscope.corpus.search.CHUNK_ROWS", 97)  # many chunks, a ragged last one
    chunked = exact_search(data, np.asarray(data[5]), 40)
    assert whole[0].tolist() == chunked[0].tolist() and np.array_equal(whole[1], chunked[1])


@pytest.mark.parametrize(("by", "layer"), [("embedding", 3), ("embedding", 0), ("context", 3)])
def test_the_approximate_index_finds_95_percent_of_the_exact_top_10(index: CorpusIndex, by: str, layer: int) -> None:
    data = vectors(index, by, layer, None)
    rng = np.random.default_rng(1)
    recalls = []
    for row in rng.choice(index.n_tokens, 100, replace=False):
        query = np.asarray(data[row]) + rng.normal(0, 0.05, data.shape[1])
        exact, _, method = find(index, query, layer=layer, by=by, k=10, exact=True)
        approximate, distances, ann_method = find(index, query, layer=layer, by=by, k=10)
        assert method == "exact" and ann_method == "approximate (faiss)"
        recalls.append(len(set(exact.tolist()) & set(approximate.tolist())) / 10)
        assert np.all(np.diff(distances) >= -1e-6)
    assert np.mean(recalls) >= 0.95


def test_a_sentence_of_the_corpus_finds_its_own_token_first(index: CorpusIndex, minilm: attnscope.Model) -> None:
    doc = index.document(3)
    rows = np.flatnonzero(np.asarray(index.columns["doc"]) == 3)
    token = 2
    for by, layer, head in KINDS:
        result = search(index, doc["text"], token=token, layer=layer, by=by, head=head, k=5, model=minilm,
                        exact=True)
        assert result.matches[0].row == rows[token]  # the query is computed as the corpus was
        assert result.matches[0].distance <= 1e-5 and result.matches[0].text == doc["text"]
        assert result.token_text == doc["text"][result.matches[0].start:result.matches[0].end]


def test_the_query_vector_is_the_stored_vector_of_the_same_token(index: CorpusIndex, minilm: attnscope.Model) -> None:
    doc = index.document(7)
    row = np.flatnonzero(np.asarray(index.columns["doc"]) == 7)[4]
    vector, _ = query_vector(minilm, index, doc["text"], 4, 3, "key", 4)
    assert np.abs(vector - np.asarray(index.array("key.l3"))[row, 1]).max() <= 1e-5  # head 4 is the 2nd kept


def test_the_summary_counts_the_matches(index: CorpusIndex, minilm: attnscope.Model) -> None:
    result = search(index, "The company bought a small bank .", token=2, layer=3, k=30, model=minilm)
    found = result.matches
    assert len(found) == 30 and [m.rank for m in found] == list(range(30))
    assert result.summary.total == 30
    assert Counter(result.summary.upos) == Counter(m.upos for m in found if m.upos)
    assert Counter(result.summary.deprel) == Counter(m.deprel for m in found if m.deprel)
    assert Counter(result.summary.position) == Counter(position_bin(m.position) for m in found)
    assert list(result.summary.upos.values()) == sorted(result.summary.upos.values(), reverse=True)
    assert found[0].token == "company" and found[0].upos == "NOUN"  # the same word, in a sentence of the corpus
    assert result.to_dict()["matches"][0]["token"] == "company"


def test_position_bins() -> None:
    assert [position_bin(p) for p in (0, 1, 2, 3, 4, 5, 9, 10, 79, 80, 500)] == \
        ["0", "1", "2", "3-4", "3-4", "5-9", "5-9", "10-19", "40-79", "80+", "80+"]


def test_without_faiss_the_index_is_searched_exactly(index: CorpusIndex, monkeypatch: pytest.MonkeyPatch) -> None:
    # a build without the extra: no "ann" entry (ann.build_all returns {} when faiss cannot be imported)
    monkeypatch.setattr(ann, "library", lambda: None)
    assert ann.build_all(index.root, index.manifest) == {}
    manifest = {**index.manifest, "ann": {}}
    monkeypatch.setattr(index, "manifest", manifest)
    _, _, method = find(index, np.asarray(vectors(index, "embedding", 3, None)[0]), layer=3)
    assert method == "exact"
