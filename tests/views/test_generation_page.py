"""The generation page in Chromium: tokens as text (the tokenizer's decoding of each piece, in the text, the top
alternatives and the head grid; the marks with raw_tokens / --raw-tokens), a failed check in the views' red, and
the head grid labelled (rows heads, columns key positions, 0-indexed)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import attnscope
from attnscope.records import files
from attnscope.records.generation import GenerationTrace, load_generation
from attnscope.tracing.decoding import generate
from attnscope.views import to_html
from tests.support.cli import run

PROMPT = "The capital of France is"
READ = """() => ({
  text: [...document.querySelectorAll('.as-gen-tok')].map((t) => t.textContent),
  bars: [...document.querySelectorAll('.as-gen-bar-label')].map((t) => t.textContent),
  columns: [...document.querySelectorAll('.as-gen-grid thead th')].map((t) => t.textContent),
  columnTitles: [...document.querySelectorAll('.as-gen-grid thead th')].map((t) => t.title),
  rows: [...document.querySelectorAll('.as-gen-grid tbody th')].map((t) => t.textContent),
  cells: [...document.querySelectorAll('.as-gen-grid tbody tr')].map((r) => r.querySelectorAll('td').length),
  gridTitle: document.querySelector('.as-gen-heads h3').textContent,
  badge: document.querySelector('.as-gen-note').textContent,
  badgeColour: getComputedStyle(document.querySelector('.as-gen-note')).color,
})"""
# the views' red for a failure, as Chromium computes it inside a views page (.as-app)
VIEWS_FAIL = """() => {
  const s = document.createElement('span');
  s.className = 'as-warn';
  document.querySelector('.as-app').append(s);
  return getComputedStyle(s).color;
}"""


def one_line(s: str) -> str:
    """As the page shows a token (A.oneLine): a newline, tab or carriage return as a visible mark."""
    return s.replace("\r\n", "↵").replace("\n", "↵").replace("\t", "⇥").replace("\r", "␍")


@pytest.fixture(scope="module")
def smol_generation(smollm2: attnscope.Model) -> GenerationTrace:
    return generate(PROMPT, model=smollm2, max_new_tokens=3, alternatives=3)


@pytest.fixture(scope="module")
def failed(smol_generation: GenerationTrace, tmp_path_factory: pytest.TempPathFactory) -> GenerationTrace:
    """The generation saved, one stored error tampered past the tolerance, loaded again: its check fails."""
    path = tmp_path_factory.mktemp("failed") / "g.safetensors"
    smol_generation.save(path)
    arrays, meta = files.read(path)
    meta["check"]["comparisons"][0]["errors"][0][0] = 1e-3
    files.write(path, arrays, meta, {"tokens": smol_generation.trace.token_strings})
    g = load_generation(path)
    assert not g.check().ok
    return g


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from attnscope.views.browser import chromium

    with chromium() as b:
        yield b


def shown_page(browser: Any, path: Path) -> tuple[dict[str, Any], list[str]]:
    errors: list[str] = []
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.goto(path.as_uri())
    page.wait_for_selector(".as-gen-grid")
    read: dict[str, Any] = page.evaluate(READ)
    page.close()
    return read, errors


def test_page_shows_tokens_as_they_read_and_marks_when_asked(smol_generation: GenerationTrace, browser: Any,
                                                             tmp_path: Path) -> None:
    g = smol_generation
    g.show().save(tmp_path / "g.html")
    read, errors = shown_page(browser, tmp_path / "g.html")
    assert not errors, errors
    assert read["text"] == [one_line(t.shown) for t in g.tokens] and " Paris" in read["text"]
    assert not any("Ġ" in t for t in read["text"] + read["bars"])
    last = g.steps[-1]
    assert read["bars"] == [one_line(a.shown) for a in last.alternatives]
    query = g.query_position(last.step)
    assert read["columnTitles"][1:] == [f"key {j}: {one_line(t.shown)}" for j, t in enumerate(g.tokens[: query + 1])]

    g.show(raw_tokens=True).save(tmp_path / "raw.html")
    raw, errors = shown_page(browser, tmp_path / "raw.html")
    assert not errors, errors
    assert raw["text"] == [t.text for t in g.tokens] and "ĠParis" in raw["text"]
    assert raw["bars"] == [a.text for a in last.alternatives]


def test_cli_html_raw_tokens(smollm2: attnscope.Model, browser: Any, tmp_path: Path,
                             capsys: pytest.CaptureFixture[str]) -> None:
    for flags, name in (((), "page.html"), (("--raw-tokens",), "raw.html")):
        code, _, err = run(capsys, "generate", PROMPT, "--model", "smollm2", "--max-new-tokens", "1",
                           "--html", str(tmp_path / name), *flags)
        assert code == 0, err
    page, _ = shown_page(browser, tmp_path / "page.html")
    raw, _ = shown_page(browser, tmp_path / "raw.html")
    assert page["text"][-1] == " Paris" and raw["text"][-1] == "ĠParis"
    assert page["text"][1] == " capital" and raw["text"][1] == "Ġcapital"


def test_grid_labelled_rows_heads_columns_keys(smol_generation: GenerationTrace, browser: Any,
                                               tmp_path: Path) -> None:
    g = smol_generation
    g.show().save(tmp_path / "g.html")
    read, _ = shown_page(browser, tmp_path / "g.html")
    keys = g.query_position(g.n_steps - 1) + 1
    heads = g.trace.n_heads
    assert read["rows"] == [str(h) for h in range(heads)]  # 0-indexed heads
    assert read["columns"][0] == "head \\ key" and read["columns"][1:] == [str(j) for j in range(keys)]
    assert read["cells"] == [keys] * heads
    assert read["gridTitle"] == (f"layer {g.trace.n_layers - 1}: each head's attention from position {keys - 1} "
                                 f"(rows: heads 0-{heads - 1}, columns: key positions 0-{keys - 1}; 0-indexed)")


def test_failed_check_in_the_views_red(smol_generation: GenerationTrace, failed: GenerationTrace, browser: Any,
                                       tmp_path: Path) -> None:
    (tmp_path / "views.html").write_text(to_html(smol_generation.trace, "head"), encoding="utf-8")
    page = browser.new_page()
    page.goto((tmp_path / "views.html").as_uri())
    page.wait_for_selector(".as-app")
    views_red = page.evaluate(VIEWS_FAIL)
    page.close()
    assert views_red == "rgb(180, 35, 24)"  # attnscope.css's --fail, #b42318

    failed.show().save(tmp_path / "failed.html")
    read, errors = shown_page(browser, tmp_path / "failed.html")
    assert not errors, errors
    assert read["badge"].startswith("CHECK FAILED") and "max error 1.0e-03" in read["badge"]
    assert read["badgeColour"] == views_red

    smol_generation.show().save(tmp_path / "ok.html")  # a verified generation's note stays grey
    ok, _ = shown_page(browser, tmp_path / "ok.html")
    assert ok["badge"].startswith("verified") and ok["badgeColour"] != views_red


def test_failed_check_in_the_web_apps_red(failed: GenerationTrace, browser: Any, tmp_path: Path) -> None:
    """The web app's Generate panel draws the same payload with the same renderer: its failure in serve.css's red."""
    import json

    from attnscope.serve.page import render
    from attnscope.views.generation import generation_payload

    doc, _ = render([], 10_000)
    (tmp_path / "serve.html").write_text(doc, encoding="utf-8")
    page = browser.new_page()
    page.goto((tmp_path / "serve.html").as_uri())
    page.wait_for_selector("#sv-gen-view", state="attached")
    colours = page.evaluate("""(data) => {
      const box = document.getElementById('sv-gen-view');
      window.attnscope.renderGeneration(box, data);
      const s = document.createElement('span');
      s.className = 'sv-error';
      document.body.append(s);
      return [getComputedStyle(box.querySelector('.as-gen-note')).color, getComputedStyle(s).color,
              box.querySelector('.as-gen-note').textContent];
    }""", json.loads(json.dumps(generation_payload(failed))))
    page.close()
    badge, serve_red, text = colours
    assert text.startswith("CHECK FAILED") and badge == serve_red == "rgb(180, 35, 24)"  # serve.css's --sv-fail
