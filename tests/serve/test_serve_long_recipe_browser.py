"""docs/serve.md's long-context recipe as written, in headless Chromium against a real server (issue 29): SmolLM2 at
2,048 tokens, `attnscope serve --model smollm2 --max-tokens 2048 --max-chars 200000 --cache-size 2048 --timeout
1800`, a pasted text of more than 2,048 tokens.

With the page's default boxes (norm-based and rollout ticked) the trace's maps do not fit --cache-size: the page
is refused up front (tokenizing only, no forward pass) with advice naming the boxes to untick; unticked as the
recipe says, it traces; then the Neuron tab and a matrix cell's explanation each answer (one head recomputed from
the kept x on the server), timed on the page's clock and asserted loosely (the machine is shared and noisy; the
benchmark, bench_serve --part long, measures them against the < 1 s target). Slow: the trace takes minutes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.serve import Server, start_server

RECIPE = ("--model", "smollm2", "--max-tokens", "2048", "--max-chars", "200000", "--cache-size", "2048",
          "--timeout", "1800")
TOKENS = 2048
LOOSE_MS = 20_000  # each answer after the trace, loose: 9.3 s and 5.1 s at a load average of ~20 on 2 cores
# (82 s and 107 s before the kept x); the target, < 1 s, is bench_serve --part long's
NEXT_FRAME = "() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))"
STATE = "() => document.getElementById('sv-views').attnscopeShown.state()"


def long_text(ud_dev: Path) -> str:
    """Real sentences (UD English EWT dev), ~14,000 characters: more than 2,048 SmolLM2 tokens."""
    sents = [line[9:].strip() for line in ud_dev.read_text(encoding="utf-8").splitlines()
             if line.startswith("# text = ")]
    out: list[str] = []
    while sum(len(s) + 1 for s in out) < 14_000:
        out.append(sents[len(out) % len(sents)])
    return " ".join(out)


@pytest.fixture(scope="module")
def recipe_server() -> Iterator[Server]:
    s = start_server(*RECIPE, timeout=300)
    yield s
    assert s.stop() == 0, "".join(s.stderr)[-2000:]
    log = "".join(s.stderr)
    assert "Traceback" not in log and "internal error" not in log, log[-4000:]


@pytest.fixture(scope="module")
def page(recipe_server: Server) -> Iterator[Any]:
    from attnscope.views.browser import chromium

    with chromium() as browser:
        p = browser.new_page(viewport={"width": 1400, "height": 1000})
        p.errors = []  # type: ignore[attr-defined]
        p.on("pageerror", lambda e: p.errors.append(str(e)))  # type: ignore[attr-defined]
        p.goto(recipe_server.url)
        p.wait_for_selector("#sv-status[data-kind=ok]", timeout=300_000)  # the default sentence, traced
        yield p
        assert not p.errors, p.errors  # type: ignore[attr-defined]
        p.close()


def ms_since(page: Any, start: float) -> float:
    page.evaluate(NEXT_FRAME)
    return float(page.evaluate("() => performance.now()")) - start


def test_the_recipe_refuses_the_default_boxes_up_front_then_traces_and_answers(page: Any, ud_dev: Path) -> None:
    text = long_text(ud_dev)
    assert page.is_checked("#sv-norms") and page.is_checked("#sv-rollout")  # the page's defaults
    page.fill("#sv-text", text)
    assert page.input_value("#sv-text") == text  # pasted whole: nothing cut at --max-chars
    start = float(page.evaluate("() => performance.now()"))
    page.click("#sv-go")
    page.wait_for_selector("#sv-status[data-kind=error]", timeout=120_000)
    refused_ms = ms_since(page, start)
    status = page.text_content("#sv-status") or ""
    assert f"this {TOKENS}-token trace's maps do not fit the server's map cache" in status, status
    assert "untick" in status and "--cache-size" in status, status
    assert refused_ms < 60_000  # up front: the text tokenized, no forward pass

    page.uncheck("#sv-norms")  # as the recipe and the advice say
    page.uncheck("#sv-rollout")
    start = float(page.evaluate("() => performance.now()"))
    page.click("#sv-go")
    page.wait_for_function(f"() => document.getElementById('sv-status').textContent.startsWith('{TOKENS} tokens')",
                           timeout=3_000_000)
    traced_ms = ms_since(page, start)
    status = page.text_content("#sv-status") or ""
    assert "(truncated)" in status and "maps fetched as shown" in status, status
    assert page.get_attribute("#sv-views", "data-stale") is None

    page.evaluate("""() => document.getElementById("sv-views").addEventListener("attnscope:drawn",
      (e) => { window.testDrawn = Object.assign({ at: performance.now() }, e.detail); })""")
    page.evaluate("() => { window.testDrawn = null; }")
    start = float(page.evaluate("() => performance.now()"))
    page.select_option("#sv-view", "neuron")
    page.wait_for_function("() => window.testDrawn && window.testDrawn.view === 'neuron'", timeout=300_000)
    neuron_ms = ms_since(page, start)
    state = page.evaluate(STATE)
    page.wait_for_selector("#sv-views .as-neuron-body[data-rows=all]", timeout=60_000)  # the rows past the first screen
    assert page.locator("#sv-views .as-neuron [data-key]").count() >= TOKENS  # every key of the query shown
    assert state["query"] is None  # the Neuron tab selects nothing (the head view's selection stays)

    page.select_option("#sv-view", "matrix")
    page.wait_for_selector("#sv-views canvas.as-matrix", timeout=120_000)
    page.wait_for_function("() => !document.getElementById('sv-views').dataset.attnscopeLoading", timeout=300_000)
    canvas = page.locator("#sv-views canvas.as-matrix")
    cell, label = (float(canvas.get_attribute(f"data-{k}") or "nan") for k in ("cell", "label"))
    query, key = 600, 41
    page.evaluate("() => { document.getElementById('sv-explain').dataset.state = ''; }")
    start = float(page.evaluate("() => performance.now()"))
    canvas.click(position={"x": label + (key + 0.5) * cell, "y": label + (query + 0.5) * cell})
    page.wait_for_function("() => ['ready', 'error'].includes(document.getElementById('sv-explain').dataset.state)",
                           timeout=300_000)
    explain_ms = ms_since(page, start)
    box = page.text_content("#sv-explain") or ""
    assert page.get_attribute("#sv-explain", "data-state") == "ready", box[:500]
    title = page.text_content("#sv-explain h2") or ""
    assert f"Layer {state['layer']}, head {state['head']}, query token" in title, title
    assert page.get_attribute("#sv-explain .sv-badge", "data-ok") == "true", box[:500]
    weights = page.locator('#sv-explain table[data-name="weights"] tbody tr').first.inner_text()
    assert weights.count("…") == 1  # one query row, its keys elided past the first 62 (the clicked one kept)
    print(f"\nthe long-context recipe on SmolLM2, {TOKENS} tokens: default boxes refused in {refused_ms:.0f} ms; "
          f"traced in {traced_ms / 1000:.0f} s; then the Neuron tab {neuron_ms:.0f} ms and a cell's explanation "
          f"{explain_ms:.0f} ms (page clock)")
    assert neuron_ms < LOOSE_MS and explain_ms < LOOSE_MS, (neuron_ms, explain_ms)
