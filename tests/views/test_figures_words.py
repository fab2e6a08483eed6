"""Word-level views: pieces merged into words by the statistics' own rule and code (stats --word-level), the
page's "words" toggle, and figures of words."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Callable

import numpy as np
import pytest

import attnscope
from attnscope.stats.batching import tokenize
from attnscope.stats.sources import Document
from attnscope.tracing.one_pass import Trace, trace
from attnscope.views import to_html
from attnscope.views.words import word_groups, word_trace

TEXT = "Unbelievably, tokenization splits <words>."


@pytest.fixture(scope="module")
def pieces(minilm: attnscope.Model) -> Trace:
    return trace(TEXT, model=minilm)


def test_words_are_the_statistics_units(pieces: Trace, minilm: attnscope.Model) -> None:
    prepared = tokenize(minilm.tokenizer, [Document(TEXT, "test:1")], 512)[0]
    assert word_groups(pieces) == prepared.units(word_level=True)
    assert any(len(g) > 1 for g in word_groups(pieces))  # the text has split words
    words = word_trace(pieces)
    assert words.token_strings[1] == "Unbelievably" and words.token_strings[0] == "[CLS]"


def test_to_a_word_sum_from_a_word_mean(pieces: Trace) -> None:
    groups = word_groups(pieces)
    merged = word_trace(pieces).weights  # [layer, head, word, word]
    a = pieces.weights.astype(np.float64)  # [layer, head, query, key]
    expected = np.stack([np.stack([a[..., gq, :][..., gk].sum(-1).mean(-1) for gk in groups], -1)
                         for gq in groups], -2)  # by hand: mean over the query's pieces of the sum over the key's
    assert merged.dtype == np.float32 and np.abs(merged - expected).max() <= 1e-6
    assert np.abs(merged.sum(-1) - 1).max() <= 1e-5  # a word's row is still a distribution


def test_the_words_toggle_swaps_tokens_and_words(open_page: Callable[..., object], pieces: Trace) -> None:
    opened = open_page(to_html(pieces, "all", layer=3, word_level=True), "words-toggle")
    page = opened.page  # type: ignore[attr-defined]
    q_tokens = ".as-tokens.as-q .as-tok"
    assert page.locator(q_tokens).count() == pieces.n_tokens
    page.click(".as-words")
    page.wait_for_selector(".as-words[aria-pressed=true]")
    words = word_trace(pieces)
    assert page.locator(q_tokens).all_inner_texts() == words.token_strings
    assert page.input_value("select[aria-label^=layer]") == "3"  # the selection survives the switch
    svg = page.evaluate("() => window.attnscope.figureSVG(document.getElementById('attnscope-root'))")
    group = next(g for g in ET.fromstring(svg.encode()).iter("{http://www.w3.org/2000/svg}g")
                 if g.get("class") == "tokens")
    labels = [f"{i}: {w}" for i, w in enumerate(words.token_strings)]
    assert [t.text for t in group] == [x for label in labels for x in (label, label)]  # the figure shows words
    page.click(".as-words")
    page.wait_for_selector(".as-words[aria-pressed=false]")
    assert page.locator(q_tokens).count() == pieces.n_tokens
    assert opened.errors == []  # type: ignore[attr-defined]
