"""The attribution views (views/attribution.py, assets/attribution.js) on real attributions of MiniLM and SmolLM2:
the payload carries the Attribution's numbers exactly, ranks and Spearman's rho equal scipy's, the page renders from
a file with no request beyond itself, escapes every text, recolours on the scale toggle, shows a clicked token's
score and rank under every method, and the figures are real SVG, PNG and one-page PDF files."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy.stats import rankdata, spearmanr

import attnscope
from attnscope.attribution import Attribution, attribute
from attnscope.errors import AttnscopeError
from attnscope.views.attribution import (
    DATA,
    attribution_figure,
    attribution_html,
    attribution_page,
    attribution_payload,
    average_ranks,
    save_attribution_html,
    spearman_matrix,
)
from tests.support.pages import Watched

SMOL_METHODS = "attention,rollout,saliency,input_x_gradient,leave_one_out"
MINI_METHODS = "attention,rollout,integrated_gradients,leave_one_out"
HOSTILE = "</script><script>alert('token')</script><img src=x onerror=alert(1)>"


@pytest.fixture(scope="module")
def paris(smollm2: attnscope.Model) -> Attribution:
    """SmolLM2: which of 'The capital of France is' carry ' Paris', by five methods (one target)."""
    return attribute("The capital of France is", model=smollm2, target=" Paris", methods=SMOL_METHODS)


@pytest.fixture(scope="module")
def two_targets(smollm2: attnscope.Model) -> Attribution:
    """SmolLM2 with a two-token target: two rows per method."""
    return attribute("The capital of France is", model=smollm2, target=" Paris.", methods="attention,leave_one_out")


@pytest.fixture(scope="module")
def cat(minilm: attnscope.Model) -> Attribution:
    """MiniLM: the pooled sentence embedding of 'The cat sat on the mat.' (special tokens included)."""
    return attribute("The cat sat on the mat.", model=minilm, methods=MINI_METHODS)


@pytest.fixture(scope="module")
def hostile(minilm: attnscope.Model) -> Attribution:
    """A real attribution of a text full of markup, with one token's text, the target and the description made
    markup too (a tokenizer could have such a token)."""
    a = attribute(f"{HOSTILE} the end", model=minilm, methods="attention,leave_one_out")
    tokens = [replace(t, decoded=HOSTILE) if t.index == 2 else t for t in a.tokens]
    return replace(a, tokens=tokens, targets=[HOSTILE], description=HOSTILE, model=HOSTILE)


def _page_data(html: str) -> dict[str, Any]:
    found = re.search(rf'<script type="application/json" id="{DATA}">(.*?)</script>', html, re.S)
    assert found is not None
    data: dict[str, Any] = json.loads(found.group(1))
    return data


# ---- the payload: the Attribution's numbers, exactly ---------------------------------------------------------------

@pytest.mark.parametrize("name", ["paris", "cat", "two_targets"])
def test_payload_carries_the_attributions_numbers_exactly(name: str, request: pytest.FixtureRequest) -> None:
    a: Attribution = request.getfixturevalue(name)
    data = _page_data(attribution_html(a))  # as the page carries it, through JSON
    assert data["tokens"] == [t.shown for t in a.tokens] and data["targets"] == a.targets
    assert [m["name"] for m in data["methods"]] == list(a.methods)
    for m in data["methods"]:
        ms = a.methods[m["name"]]
        assert np.array_equal(np.array(m["scores"], dtype=np.float64), ms.scores)  # bit for bit
        assert m["unit"] == ms.unit and m["check"]["status"] == ms.check.status
        assert m["check"]["detail"] == ms.check.detail
        assert m["top"] == float(np.abs(ms.scores).max())
        for t, row in enumerate(ms.scores):
            assert np.array_equal(np.array(m["ranks"][t]), rankdata(-row, method="average"))
        assert m["signed"] == (m["name"] in ("input_x_gradient", "integrated_gradients", "leave_one_out")
                               or bool((ms.scores < 0).any()))
    assert data["status"] == a.status


def test_the_raw_tokens_option_shows_the_tokenizers_pieces(paris: Attribution) -> None:
    assert attribution_payload(paris, raw_tokens=True)["tokens"] == [t.text for t in paris.tokens]
    assert "Ġcapital" in attribution_payload(paris, raw_tokens=True)["tokens"]
    assert " capital" in attribution_payload(paris)["tokens"]


# ---- ranks and Spearman's rho against scipy ------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["paris", "cat", "two_targets"])
def test_spearman_matrix_equals_scipy(name: str, request: pytest.FixtureRequest) -> None:
    a: Attribution = request.getfixturevalue(name)
    names = list(a.methods)
    compared = 0
    for t in range(len(a.targets)):
        rho = spearman_matrix(a, t)
        for i, x in enumerate(names):
            for j, y in enumerate(names):
                want = spearmanr(a.scores(x)[t], a.scores(y)[t]).statistic
                if np.isnan(want):  # a constant row (scipy warns and says nan): ours says not defined
                    assert rho[i][j] is None
                else:
                    assert rho[i][j] is not None and abs(rho[i][j] - want) <= 1e-12, (x, y, rho[i][j], want)
                    compared += 1
    assert compared >= len(names) ** 2 - 2 * len(names)


def test_ranks_on_ties_and_nan_are_scipys() -> None:
    rng = np.random.default_rng(0)
    for _ in range(200):  # many ties: values drawn from 4 levels
        a = rng.integers(0, 4, 9).astype(float)
        assert np.array_equal(average_ranks(a), rankdata(-a))
    ranks = average_ranks(np.array([3.0, np.nan, 1.0]))
    assert ranks[0] == 1 and np.isnan(ranks[1]) and ranks[2] == 2


def test_a_constant_method_is_said_to_have_no_rank_correlation(cat: Attribution) -> None:
    flat = replace(cat.methods["attention"], scores=np.full_like(cat.scores("attention"), 0.25))
    a = replace(cat, methods={**cat.methods, "attention": flat})
    agreement = attribution_payload(a)["agreement"][0]
    assert agreement["rho"][0][1] is None and "attention gives every token the same score" in agreement["note"]


def test_nan_scores_are_null_never_zero(cat: Attribution) -> None:
    scores = cat.scores("leave_one_out").copy()
    scores[0, 3] = np.nan
    a = replace(cat, methods={**cat.methods, "leave_one_out": replace(cat.methods["leave_one_out"], scores=scores)})
    m = attribution_payload(a)["methods"][3]
    assert m["scores"][0][3] is None and m["ranks"][0][3] is None and m["top"] == float(np.nanmax(np.abs(scores)))
    json.dumps(attribution_payload(a), allow_nan=False)  # strict JSON


def test_bad_options_and_records_are_one_line_errors(cat: Attribution) -> None:
    with pytest.raises(AttnscopeError, match="colours='loud' is not known: use method or shared"):
        attribution_html(cat, colours="loud")
    short = replace(cat.methods["attention"], scores=cat.scores("attention")[:, :3])
    with pytest.raises(AttnscopeError, match=r"attention's scores are \(1, 3\), not \[target, token\]"):
        attribution_payload(replace(cat, methods={**cat.methods, "attention": short}))
    with pytest.raises(AttnscopeError, match="unsupported figure format 'gif'"):
        attribution_figure(cat, "x.gif")


# ---- the page in a real browser -----------------------------------------------------------------------------------

def _cells(opened: Watched) -> list[dict[str, Any]]:
    got: list[dict[str, Any]] = opened.page.eval_on_selector_all(".as-attr-cell", """cs => cs.map(c => ({
        method: +c.dataset.method, target: +c.dataset.target, token: +c.dataset.token, text: c.textContent,
        value: c.dataset.value, background: getComputedStyle(c).backgroundColor}))""")
    return got


def _rgb(cell: dict[str, Any]) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", cell["background"])[:3])


def test_page_renders_offline_with_every_cell_badge_and_unit(two_targets: Attribution,
                                                             open_page: Callable[..., Watched]) -> None:
    a = two_targets
    opened = open_page(attribution_html(a), "attribution-two-targets")
    assert opened.foreign_requests() == [] and opened.errors == []
    cells = _cells(opened)
    assert len(cells) == len(a.methods) * len(a.targets) * len(a.tokens)
    names = list(a.methods)
    for c in cells:
        assert float(c["value"]) == a.scores(names[c["method"]])[c["target"], c["token"]]
        assert c["text"] == a.tokens[c["token"]].shown.replace("\n", "↵")
    rows = opened.page.eval_on_selector_all(".as-attr-heat tbody tr", """rs => rs.map(r => ({
        method: r.dataset.method, badge: r.querySelector('.as-attr-badge').textContent,
        title: r.querySelector('.as-attr-badge').title, unit: r.querySelector('.as-attr-unit').textContent}))""")
    assert len(rows) == len(a.methods) * len(a.targets)
    for r in rows:
        ms = a.methods[r["method"]]
        assert r["badge"] == ms.check.status and ms.check.detail in r["title"] and r["unit"] == ms.unit
    headings = opened.page.eval_on_selector_all(".as-attr-target h3", "hs => hs.map(h => h.textContent)")
    assert headings == [f"target {t} (0-indexed): {json.dumps(x)}" for t, x in enumerate(a.targets)]
    opened.shot("attribution-two-targets")


def test_every_text_is_escaped(hostile: Attribution, open_page: Callable[..., Watched]) -> None:
    hostile = replace(hostile, skipped={"saliency": HOSTILE})  # a method left out, with a reason in markup
    html = attribution_html(hostile)
    assert "<script>alert" not in html and "<img" not in html  # in the JSON block as \\u003c
    opened = open_page(html, "attribution-hostile")
    assert opened.dialogs == [] and opened.errors == [] and opened.foreign_requests() == []
    page = opened.page
    assert page.eval_on_selector_all("script", "ss => ss.length") == 2  # the data block and the page's own
    assert page.eval_on_selector_all("img", "xs => xs.length") == 0
    shown = page.eval_on_selector(".as-attr-cell[data-token='2']", "c => c.textContent")
    assert shown == HOSTILE
    assert page.eval_on_selector(".as-attr h2", "h => h.firstChild.textContent") == \
        f"{HOSTILE} ({hostile.architecture}): {HOSTILE}"
    assert page.eval_on_selector(".as-attr-skipped li", "li => li.textContent") == f"saliency: {HOSTILE}"
    page.click(".as-attr-cell[data-token='2']")
    assert HOSTILE in page.eval_on_selector(".as-attr-tok caption", "c => c.textContent")
    svg = page.evaluate("() => window.attnscope.figureSVG(document.getElementById('attnscope-root'))")
    root = ET.fromstring(svg.split("?>", 1)[1])  # well-formed: the token is text in it
    texts = [e.text for e in root.iter("{http://www.w3.org/2000/svg}text")]
    assert HOSTILE in texts and not list(root.iter("{http://www.w3.org/2000/svg}script"))


def test_the_scale_toggle_recolours(paris: Attribution, open_page: Callable[..., Watched]) -> None:
    opened = open_page(attribution_html(paris), "attribution-toggle")
    per_method = _cells(opened)
    opened.page.click(".as-attr-toggle button[data-scale='shared']")
    shared = _cells(opened)
    assert opened.page.eval_on_selector("#attnscope-root", "r => r.dataset.scale") == "shared"
    names = list(paris.methods)
    widest = max(names, key=lambda n: float(np.abs(paris.scores(n)).max()))  # its own scale is the shared one
    for before, after in zip(per_method, shared, strict=True):
        if names[before["method"]] == widest:
            assert before["background"] == after["background"]
        else:  # a smaller scale's colours fade on the shared one, never darken
            assert sum(_rgb(after)) >= sum(_rgb(before))
    for k, name in enumerate(names):
        if name != widest:  # each other method's strongest cell changes colour
            top = int(np.argmax(np.abs(paris.scores(name)[0])))
            assert per_method[k * len(paris.tokens) + top]["background"] != shared[k * len(paris.tokens) + top][
                "background"], name
    opened.page.click(".as-attr-toggle button[data-scale='method']")
    assert _cells(opened) == per_method


def test_the_largest_score_is_the_darkest_and_signs_diverge(paris: Attribution,
                                                           open_page: Callable[..., Watched]) -> None:
    opened = open_page(attribution_html(paris), "attribution-colours")
    cells = _cells(opened)
    rgb = _rgb
    names = list(paris.methods)
    for k, name in enumerate(names):
        row = [c for c in cells if c["method"] == k]
        top = int(np.argmax(np.abs(paris.scores(name)[0])))
        assert sum(rgb(row[top])) == min(sum(rgb(c)) for c in row)  # the strongest colour at the largest |score|
    ixg = [c for c in cells if names[c["method"]] == "input_x_gradient"]
    negative = [c for c in ixg if float(c["value"]) < 0]
    positive = [c for c in ixg if float(c["value"]) > 0]
    assert negative and positive  # this input has both: blue (b > r) below 0, orange (r > b) above
    assert all(rgb(c)[2] > rgb(c)[0] for c in negative) and all(rgb(c)[0] > rgb(c)[2] for c in positive)


@pytest.mark.parametrize("token", [0, 3])
def test_clicking_a_token_shows_its_score_and_rank_under_every_method(paris: Attribution, token: int,
                                                                      open_page: Callable[..., Watched]) -> None:
    opened = open_page(attribution_html(paris), f"attribution-click-{token}")
    assert opened.page.eval_on_selector_all(".as-attr-tok", "ts => ts.length") == 0
    opened.page.click(f".as-attr-cell[data-method='1'][data-token='{token}']")
    rows = opened.page.eval_on_selector_all(".as-attr-tok tbody tr", """rs => rs.map(r => ({
        method: r.dataset.method, score: r.querySelector('.score').dataset.value,
        shown: r.querySelector('.score').textContent, rank: r.querySelector('.rank').textContent}))""")
    assert [r["method"] for r in rows] == list(paris.methods)
    n = len(paris.tokens)
    for r in rows:
        row = paris.scores(r["method"])[0]
        assert float(r["score"]) == row[token]
        rank = rankdata(-row)[token]
        assert r["rank"] == f"{int(rank) if rank == int(rank) else f'{rank:.1f}'} of {n}"
        assert r["shown"] == (f"{row[token]:.4f}" if abs(row[token]) >= 1e-3 else r["shown"])
    picked = opened.page.eval_on_selector_all(".as-attr-picked", "cs => cs.map(c => +c.dataset.token)")
    assert picked == [token] * len(paris.methods)  # the token's column, in every method's row


def test_the_agreement_table_shows_pythons_rho(cat: Attribution, open_page: Callable[..., Watched]) -> None:
    opened = open_page(attribution_html(cat), "attribution-rho")
    cells = opened.page.eval_on_selector_all(".as-attr-rho td", """ts => ts.map(t => ({a: t.dataset.a,
        b: t.dataset.b, value: t.dataset.value, text: t.textContent}))""")
    names = list(cat.methods)
    rho = spearman_matrix(cat)
    assert len(cells) == len(names) ** 2
    for c in cells:
        want = rho[names.index(c["a"])][names.index(c["b"])]
        assert (c["value"] == "") if want is None else float(c["value"]) == want
        assert c["text"] == ("—" if want is None else f"{want:.2f}")


# ---- Jupyter, files and figures -----------------------------------------------------------------------------------

def test_jupyter_and_saved_pages(cat: Attribution, tmp_path: Path) -> None:
    page = attribution_page(cat)
    shown = page._repr_html_()
    assert shown.startswith('<div class="attnscope-frame"') and 'sandbox="allow-scripts"' in shown
    assert 360 <= page.height <= 900
    path = save_attribution_html(cat, tmp_path / "a.html", colours="shared")
    assert _page_data(path.read_text(encoding="utf-8"))["colours"] == "shared"
    with pytest.raises(AttnscopeError, match="cannot write"):
        save_attribution_html(cat, tmp_path / "missing" / "a.html")


def _pdf_pages(data: bytes) -> int:
    return len(re.findall(rb"/Type\s*/Page(?![A-Za-z])", data))


def test_figures_are_real_files(paris: Attribution, tmp_path: Path) -> None:
    svg = attribution_figure(paris, tmp_path / "a.svg").read_text(encoding="utf-8")
    root = ET.fromstring(svg.split("?>", 1)[1])
    ns = "{http://www.w3.org/2000/svg}"
    drawn = {(g.get("data-method"), int(r.get("data-token", -1))): float(r.get("data-value", "nan"))
             for g in root.iter(f"{ns}g") if g.get("class") == "method" for r in g.iter(f"{ns}rect")}
    assert drawn == {(n, i): paris.scores(n)[0, i] for n in paris.methods for i in range(len(paris.tokens))}
    texts = {e.text for e in root.iter(f"{ns}text")}
    assert {" capital", " France", "saliency", "PASS"} <= texts and any("smollm2" in (t or "") for t in texts)
    png = attribution_figure(paris, tmp_path / "a.png", scale=1.0).read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    assert abs(width - float(root.get("width", 0))) <= 1 and abs(height - float(root.get("height", 0))) <= 1
    pdf = attribution_figure(paris, tmp_path / "a.pdf").read_bytes()
    assert pdf[:5] == b"%PDF-" and _pdf_pages(pdf) == 1
    bare = attribution_figure(paris, tmp_path / "bare.svg", caption=False).read_text(encoding="utf-8")
    assert 'class="caption"' in svg and 'class="caption"' not in bare


def test_a_long_texts_figure_wraps_its_tokens_onto_lines(minilm: attnscope.Model, tmp_path: Path) -> None:
    """128 tokens: the cells go on in lines at most ~1100 px wide, every token's cell drawn once per method."""
    text = " ".join(["The quick brown fox jumps over the lazy dog near the river bank."] * 9)
    a = attribute(text, model=minilm, methods="attention,leave_one_out", max_length=128)
    assert len(a.tokens) == 128
    root = ET.fromstring(attribution_figure(a, tmp_path / "long.svg").read_text(encoding="utf-8").split("?>", 1)[1])
    ns = "{http://www.w3.org/2000/svg}"
    assert float(root.get("width", 0)) < 1900  # unwrapped it was 4,696 px
    for name in a.methods:
        cells = [r for g in root.iter(f"{ns}g") if g.get("data-method") == name for r in g.iter(f"{ns}rect")]
        assert sorted(int(r.get("data-token", -1)) for r in cells) == list(range(128))
        assert [float(r.get("data-value", "nan")) for r in cells] == a.scores(name)[0].tolist()


# ---- an encoder-decoder, and the web app's answer ------------------------------------------------------------------

@pytest.fixture(scope="module")
def translation(seq2seq: Callable[[str], attnscope.Model]) -> Attribution:
    """A random-weight T5: each token of 'le chat' given 'the cat sat' (source, then decoder-input tokens)."""
    return attribute("the cat sat", model=seq2seq("t5"), target="le chat", methods="saliency,leave_one_out")


def test_an_encoder_decoders_source_and_decoder_input_are_labelled(translation: Attribution,
                                                                   open_page: Callable[..., Watched]) -> None:
    a = translation
    n_source = sum(t.segment == 0 for t in a.tokens)
    assert 0 < n_source < len(a.tokens)
    opened = open_page(attribution_html(a), "attribution-t5")
    assert opened.errors == [] and opened.foreign_requests() == []
    parts = opened.page.eval_on_selector_all(".as-attr-heat[data-target='0'] .as-attr-parts th[colspan]",
                                             "hs => hs.map(h => [h.textContent, +h.colSpan])")
    assert parts == [["source", n_source], ["decoder input (the target so far)", len(a.tokens) - n_source]]
    cells = _cells(opened)
    names = list(a.methods)
    for c in cells:  # a score that is not a number (leave-one-out of the start token) is NaN and grey, never 0
        want = a.scores(names[c["method"]])[c["target"], c["token"]]
        assert (c["value"] == "NaN" and c["background"] == "rgb(208, 208, 208)") if np.isnan(want) \
            else float(c["value"]) == want
    svg = opened.page.evaluate("() => window.attnscope.figureSVG(document.getElementById('attnscope-root'))")
    assert "decoder input (the target so far)" in svg


def test_the_web_apps_answer_draws_through_render_attribution_response(cat: Attribution,
                                                                       open_page: Callable[..., Watched]) -> None:
    answer = {**cat.to_json(), "view": attribution_payload(cat)}  # what POST /api/attribute answers
    other = attribute("A dog barked.", model=cat.model, methods="attention,rollout")
    opened = open_page(attribution_html(other), "attribution-response")
    drawn = opened.page.evaluate("""(answer) => {
        const root = document.getElementById('attnscope-root');
        window.attnscope.renderAttributionResponse(root, answer);
        return [...root.querySelectorAll('.as-attr-cell')].map(c => c.dataset.value);
    }""", json.loads(json.dumps(answer)))
    assert [float(v) for v in drawn] == [float(x) for n in cat.methods for x in cat.scores(n)[0]]
    said = opened.page.evaluate("""() => {
        const root = document.getElementById('attnscope-root');
        window.attnscope.renderAttributionResponse(root, {error: "unknown attribution method 'x'"});
        return root.querySelector('[role=alert]').textContent;
    }""")
    assert said == "unknown attribution method 'x'" and opened.errors == []
