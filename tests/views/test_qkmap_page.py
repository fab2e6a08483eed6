"""The query/key map page in a real headless Chromium: one point per query and per key of every sampled token in each
head's panel, the colour toggle, hovering shows the token in its sentence as text (a `<script>` token stays text),
nothing fetched; the figure, Jupyter and the CLI. Data: a tiny real MiniLM index of a hand-written CoNLL-U file."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import attnscope
from attnscope.corpus.index import build_index
from attnscope.corpus.maps import available
from attnscope.corpus.store import CorpusIndex
from attnscope.corpus.tags import TaggedSource
from attnscope.stats.settings import Settings
from attnscope.views.qkmap import ROOT, qkmap_figure, qkmap_html, qkmap_page, qkmap_payload
from tests.support.cli import run
from tests.support.pages import Watched, open_file

# Three sentences, the second with markup for a word (UPOS X): the page must show it as text.
CONLLU = """# text = The cat sat .
1\tThe\tthe\tDET\t_\t_\t2\tdet\t_\t_
2\tcat\tcat\tNOUN\t_\t_\t3\tnsubj\t_\t_
3\tsat\tsit\tVERB\t_\t_\t0\troot\t_\t_
4\t.\t.\tPUNCT\t_\t_\t3\tpunct\t_\t_

# text = A <script>alert(1)</script> tag & more .
1\tA\ta\tDET\t_\t_\t3\tdet\t_\t_
2\t<script>alert(1)</script>\tx\tX\t_\t_\t3\tcompound\t_\t_
3\ttag\ttag\tNOUN\t_\t_\t0\troot\t_\t_
4\t&\t&\tCCONJ\t_\t_\t5\tcc\t_\t_
5\tmore\tmore\tADJ\t_\t_\t3\tconj\t_\t_
6\t.\t.\tPUNCT\t_\t_\t3\tpunct\t_\t_

# text = Dogs bark at night .
1\tDogs\tdog\tNOUN\t_\t_\t2\tnsubj\t_\t_
2\tbark\tbark\tVERB\t_\t_\t0\troot\t_\t_
3\tat\tat\tADP\t_\t_\t4\tcase\t_\t_
4\tnight\tnight\tNOUN\t_\t_\t2\tobl\t_\t_
5\t.\t.\tPUNCT\t_\t_\t2\tpunct\t_\t_
"""
LAYER, HEADS = 2, (0, 5)


@pytest.fixture(scope="module")
def tiny(minilm: attnscope.Model, tmp_path_factory: pytest.TempPathFactory) -> CorpusIndex:
    folder = tmp_path_factory.mktemp("qkmap")
    (folder / "tiny.conllu").write_text(CONLLU, encoding="utf-8")
    build_index(TaggedSource(str(folder / "tiny.conllu")), folder / "index", minilm, layers=[LAYER], heads=HEADS,
                settings=Settings(max_length=32, batch_size=4), ann=())
    return CorpusIndex(folder / "index")


@pytest.fixture(scope="module")
def opened(browser: Any, tiny: CorpusIndex, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Watched]:
    seen = open_file(browser, qkmap_html(tiny, LAYER), tmp_path_factory.mktemp("qkpage") / "qkmap.html", [ROOT])
    yield seen
    seen.page.close()


def test_one_point_per_query_and_per_key_in_each_heads_panel(opened: Watched, tiny: CorpusIndex) -> None:
    page = opened.page
    n = tiny.n_tokens  # 3 sentences, every token sampled (fewer than the limit)
    assert page.locator(".as-qk-panel").count() == len(HEADS)
    for head in HEADS:
        panel = f'.as-qk-panel[data-head="{head}"]'
        assert page.locator(f'{panel} circle[data-kind="query"]').count() == n
        assert page.locator(f'{panel} circle[data-kind="key"]').count() == n
        rows = page.eval_on_selector_all(f'{panel} circle[data-kind="query"]', "cs => cs.map(c => +c.dataset.row)")
        assert sorted(rows) == list(range(n))
    assert opened.requests == [opened.url] and opened.errors == []


def test_hover_shows_the_token_in_its_sentence_as_text(opened: Watched, tiny: CorpusIndex) -> None:
    page = opened.page
    data = qkmap_payload(tiny, LAYER)
    row = next(i for i, t in enumerate(data["tokens"]) if t["text"] == "<")  # the first piece of <script>
    scripts = page.locator("script").count()
    page.locator(f'.as-qk-panel[data-head="5"] circle[data-kind="key"][data-row="{row}"]').hover(force=True)
    tip = page.locator(".as-qk-tip")
    assert tip.is_visible()
    text = tip.inner_text()
    assert 'key · head 5 · token "<" at position 2 (X, compound)' in text
    assert "A <script>alert(1)</script> tag & more ." in text
    assert tip.locator("mark").inner_text() == "<"
    assert page.locator("script").count() == scripts and opened.dialogs == []
    page.mouse.move(2, 2)
    assert not tip.is_visible()


def test_the_colour_toggle(opened: Watched) -> None:
    page = opened.page
    fills = 'cs => cs.map(c => c.getAttribute("fill"))'
    kind = set(page.eval_on_selector_all('.as-qk-panel[data-head="0"] circle', fills))
    assert len(kind) == 2  # query blue, key orange
    page.click('button[data-colour="upos"]')
    upos = page.eval_on_selector_all('.as-qk-panel[data-head="0"] circle[data-kind="query"]', fills)
    assert len(set(upos)) >= 6  # DET, NOUN, VERB, PUNCT, X, CCONJ, ADJ, ADP and grey for [CLS]/[SEP]
    assert page.locator('button[data-colour="upos"][aria-pressed="true"]').count() == 1
    page.click('button[data-colour="kind"]')


def test_the_figure_and_jupyter(tiny: CorpusIndex, tmp_path: Path) -> None:
    svg = qkmap_figure(tiny, LAYER, tmp_path / "m.svg", heads=[5], colour="position").read_text(encoding="utf-8")
    assert svg.count('class="as-qk-point"') == 2 * tiny.n_tokens and "layer 2 head 5" in svg
    assert "<script>" not in svg  # no token text in the markup
    png = qkmap_figure(tiny, LAYER, tmp_path / "m.png").read_bytes()
    assert png.startswith(b"\x89PNG")
    shown = qkmap_page(tiny, LAYER)._repr_html_()
    assert '<iframe sandbox="allow-scripts"' in shown and "&lt;script&gt;" in shown


def test_the_cli(tiny: CorpusIndex, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "q.html"
    code, stdout, _ = run(capsys, "qkmap", str(tiny.root), "--layer", "2", "--head", "5", "-o", str(out),
                          "--colour-by", "upos")
    assert code == 0 and str(out) in stdout
    assert '"colour":"upos"' in out.read_text(encoding="utf-8")
    cases = [(["--layer", "3"], "holds layers 2"), (["--layer", "2", "--head", "1"], "--head 1")]
    if "umap" not in available():
        cases.append((["--layer", "2", "--projection", "umap"], "umap-learn"))
    for args, said in cases:
        code, _, err = run(capsys, "qkmap", str(tiny.root), *args, "-o", str(out))
        assert code == 2 and err.count("\n") == 1 and said in err, err
    code, _, err = run(capsys, "qkmap", str(tiny.root), "--layer", "2", "-o", str(tmp_path / "q.txt"))
    assert code == 2 and "FILE.html" in err
