"""The heads page in a real headless Chromium: a leaf and a point per head, a click on a head opens that layer and head
in the attention views of the example trace, labels set as text (a relation name with markup stays text), the
comparison tables; the figure. Data: a heads pass of the real MiniLM over 8 UD sentences."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import attnscope
from attnscope.corpus.head_groups import HeadGroups, compare, groups
from attnscope.corpus.heads import head_pass
from attnscope.corpus.tags import TaggedSource
from attnscope.stats.settings import Settings
from attnscope.tracing.one_pass import trace
from attnscope.views.heads import ROOT, heads_figure, heads_html, heads_page
from tests.support.heads import hand_made_sums
from tests.support.pages import Watched, open_file

MARKUP = "<img src=x onerror=alert(1)>"


@pytest.fixture(scope="module")
def minilm_heads(minilm: attnscope.Model, ud_dev: Path, tmp_path_factory: pytest.TempPathFactory) -> HeadGroups:
    run = head_pass(TaggedSource(str(ud_dev)), tmp_path_factory.mktemp("heads"), minilm,
                    settings=Settings(max_length=32, batch_size=4, limit=8))
    g = groups(run.sums, run.syntax, run.model, run.causal)
    labels = [list(x) for x in g.labels]
    labels[7] = [*labels[7], f"syntactic:{MARKUP}"]  # a CoNLL-U relation could be any text
    return dataclasses.replace(g, labels=labels)


@pytest.fixture(scope="module")
def opened(browser: Any, minilm_heads: HeadGroups, minilm: attnscope.Model,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Watched]:
    other = groups(hand_made_sums(False), None, "hand-made", False)
    shown = trace("The cat sat on the mat.", model=minilm)
    seen = open_file(browser, heads_html(minilm_heads, shown, compare(minilm_heads, other)),
                     tmp_path_factory.mktemp("headspage") / "heads.html", [ROOT, "attnscope-root"], width=1400)
    yield seen
    seen.page.close()


def test_a_leaf_and_a_point_per_head(opened: Watched) -> None:
    page = opened.page
    units = lambda sel: sorted(page.eval_on_selector_all(sel, "ns => ns.map(n => +n.dataset.unit)"))  # noqa: E731
    assert units(".as-hd-map circle[data-unit]") == list(range(72))
    assert units(".as-hd-dendrogram text[data-unit]") == list(range(72))
    assert page.locator(".as-hd-dendrogram polyline").count() == 71  # a link per merge
    assert opened.requests == [opened.url] and opened.errors == []


def test_a_click_on_a_head_opens_it_in_the_attention_views(opened: Watched) -> None:
    page = opened.page
    page.click('.as-hd-map circle[data-unit="20"]')  # layer 1, head 8
    page.wait_for_function("() => document.querySelector('#attnscope-root select[aria-label^=\"layer\"]')"
                           ".value === '1'", timeout=10_000)
    chips = page.eval_on_selector_all("#attnscope-root .as-chip[aria-pressed=true]",
                                      "cs => cs.map(c => c.dataset.head)")
    assert chips == ["8"]
    assert page.locator(".as-hd-picked").inner_text().startswith("head 1.8 (layer.head, 0-indexed)")
    page.click('.as-hd-dendrogram text[data-unit="2"]')  # layer 0, head 2
    page.wait_for_function("() => document.querySelector('#attnscope-root select[aria-label^=\"layer\"]')"
                           ".value === '0'", timeout=10_000)


def test_labels_are_text(opened: Watched) -> None:
    page = opened.page
    assert page.locator("img").count() == 0 and opened.dialogs == []
    title = page.eval_on_selector('.as-hd-map circle[data-unit="7"] title', "t => t.textContent")
    assert MARKUP in title
    page.click('.as-hd-map circle[data-unit="7"]')
    assert MARKUP in page.locator(".as-hd-picked").inner_text()


def test_the_comparison_tables(opened: Watched, minilm_heads: HeadGroups) -> None:
    page = opened.page
    header = page.locator(".as-hd-counts thead").inner_text()
    assert "all-MiniLM-L6-v2" in header and "hand-made" in header
    assert page.locator(".as-hd-nearest tbody tr").count() == 72
    counts = minilm_heads.label_counts()
    row = page.locator(".as-hd-counts tbody tr", has_text="first/special").inner_text().split()
    assert int(row[-2]) == counts["first/special"] and int(row[-1]) == 3  # the hand-made first-token heads


def test_the_figure_and_jupyter(minilm_heads: HeadGroups, tmp_path: Path) -> None:
    svg = heads_figure(minilm_heads, tmp_path / "h.svg").read_text(encoding="utf-8")
    assert svg.count("<circle data-unit=") == 72 and svg.count("<polyline") == 71
    assert "<img" not in svg and "&#60;img" in svg
    assert heads_figure(minilm_heads, tmp_path / "h.png").read_bytes().startswith(b"\x89PNG")
    assert '<iframe sandbox="allow-scripts"' in heads_page(minilm_heads)._repr_html_()
