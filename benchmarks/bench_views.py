"""How big and how fast are the views, next to bertviz? (issue: Views)

For a real text of 64, 256 and 512 tokens on the bundled model (6 layers x 12 heads):
  - bytes of bertviz's model_view(..., html_action="return") for the model's attentions,
  - bytes of attnscope's model view page for the same attentions (attnscope.bertviz.model_view,
    which carries only the weights) and of the traced page (trace.to_html(view="model"), which
    also carries the norm-based maps the trace computes), and their ratios to bertviz's,
  - load time of the traced model view and of the "all" page in headless Chromium from file://:
    wall clock from navigation to drawn (warm browser, median of 3), and the page's own
    clock from navigation start to the "attnscope:ready" mark,
  - how long a layer switch and a token hover take in the head view (next frame drawn).
Targets at 256 tokens: model view <= 1/20 of bertviz's bytes; interactive in < 2 s.

    .venv/bin/python benchmarks/bench_views.py [--tokens 64 256 512] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import torch

import attnscope
from attnscope import bertviz as ours
from attnscope.views.browser import READY, chromium
from corpus import ud_dev

UD_DEV = ud_dev()
NEXT_FRAME = "() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))"


def long_text(tokens: int, tokenizer: Any) -> str:
    """Running text from the UD English dev set, at least `tokens` tokens long."""
    sents = [line[9:].strip() for line in UD_DEV.read_text(encoding="utf-8").splitlines()
             if line.startswith("# text = ")]
    words: list[str] = []
    while len(tokenizer(" ".join(words))["input_ids"]) < tokens + 2:
        words.append(sents[len(words) % len(sents)])
    return " ".join(words)


def bertviz_bytes(attention: tuple[torch.Tensor, ...], tokens: list[str]) -> int:
    from bertviz import model_view

    return len(model_view(attention, tokens, html_action="return").data.encode("utf-8"))


def load_times(browser: Any, html: str, folder: Path, repeats: int) -> tuple[float, float]:
    """(wall seconds from goto to drawn, page ms from navigation start to ready), medians."""
    path = folder / "page.html"
    path.write_text(html, encoding="utf-8")
    walls, marks = [], []
    for _ in range(repeats):
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        start = time.perf_counter()
        page.goto(path.as_uri())
        page.wait_for_selector(READY, state="attached", timeout=120_000)
        page.evaluate(NEXT_FRAME)  # drawn on screen, not only built
        walls.append(time.perf_counter() - start)
        marks.append(page.evaluate("() => performance.getEntriesByName('attnscope:ready')[0].startTime"))
        page.close()
    return statistics.median(walls), statistics.median(marks)


def interaction_ms(browser: Any, html: str, folder: Path) -> tuple[float, float]:
    """(layer switch, token hover) in the head view of the "all" page, ms until the next frame."""
    path = folder / "all.html"
    path.write_text(html, encoding="utf-8")
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(path.as_uri())
    page.wait_for_selector(READY, state="attached", timeout=120_000)
    start = time.perf_counter()
    page.select_option('select[aria-label="layer (0-indexed)"]', "3")
    page.evaluate(NEXT_FRAME)
    layer = (time.perf_counter() - start) * 1000
    start = time.perf_counter()
    page.hover('.as-q .as-tok[data-index="5"]')
    page.evaluate(NEXT_FRAME)
    hover = (time.perf_counter() - start) * 1000
    page.close()
    return layer, hover


def measure(m: attnscope.Model, tokens: int, browser: Any, folder: Path, repeats: int) -> dict[str, float]:
    tr = attnscope.trace(long_text(tokens, m.tokenizer), model=m, max_length=tokens)
    attention = tuple(torch.from_numpy(w[None]) for w in tr.weights)  # the model's output_attentions
    start = time.perf_counter()
    page = ours.model_view(attention, tr.token_strings, html_action="return")
    build = time.perf_counter() - start
    assert page is not None
    traced_model = tr.to_html(view="model")
    all_page = tr.to_html(view="all")
    row = {"tokens": tr.n_tokens, "bertviz": bertviz_bytes(attention, tr.token_strings),
           "ours": len(page.data.encode("utf-8")), "traced": len(traced_model.encode("utf-8")),
           "all": len(all_page.encode("utf-8")), "build": build}
    row["load"], row["ready"] = load_times(browser, traced_model, folder, repeats)
    row["all_load"], row["all_ready"] = load_times(browser, all_page, folder, repeats)
    row["layer_ms"], row["hover_ms"] = interaction_ms(browser, all_page, folder)
    return row


# ---- the long-context matrix view (h16figs): tiles and level-of-detail vs one full-size image ------------------

# The matrix view before tiles, as a baseline run in the same page: colour every cell of the n x n map into one
# image through the colour table, then draw it scaled into the 720 px square.
FULL_IMAGE = """async () => {
  const A = window.attnscope;
  const model = await A.decode(JSON.parse(document.getElementById('attnscope-data').textContent));
  const src = model.sources.get('weights');
  const times = [];
  for (const head of [1, 0, 1]) {
    const t = performance.now();
    const n = src.nq, codes = src.codes(0, head), lut = new Uint32Array(A.lut('light').buffer);
    const off = document.createElement('canvas'); off.width = n; off.height = n;
    const g = off.getContext('2d'); const img = g.createImageData(n, n); const px = new Uint32Array(img.data.buffer);
    for (let i = 0; i < n * n; i++) px[i] = lut[codes[i]];
    g.putImageData(img, 0, 0);
    const c = document.createElement('canvas'); c.width = c.height = 720; document.body.append(c);
    c.getContext('2d').drawImage(off, 0, 0, 720, 720);
    await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
    times.push(performance.now() - t); c.remove();
  }
  return times.sort((a, b) => a - b)[1];
}"""


def long_matrix_trace(n: int) -> Any:
    """n tokens, 1 layer x 2 heads of causal softmax weights from random logits (drawing cost only)."""
    import numpy as np

    from attnscope.bertviz import trace_from_attention

    logits = np.random.default_rng(0).normal(size=(1, 2, n, n)).astype(np.float32) * 3
    logits[..., np.triu(np.ones((n, n), dtype=bool), 1)] = -np.inf
    w = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return trace_from_attention((w / w.sum(axis=-1, keepdims=True)).astype(np.float32), [f"t{i}" for i in range(n)])


# In the page: median ms from an event to the next frame drawn (no driver round trips in the timing).
STEPS = """async (kind) => {
  const frame = () => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
  const canvas = document.querySelector('canvas.as-matrix');
  const box = canvas.getBoundingClientRect();
  const at = (x, y) => ({ clientX: box.left + x, clientY: box.top + y, bubbles: true, cancelable: true });
  const times = [];
  for (let i = 0; i < 6; i++) {
    const t = performance.now();
    if (kind === 'overview') document.querySelector(`.as-chip[data-head="${(i + 1) % 2}"]`).click();
    if (kind === 'zoom') canvas.dispatchEvent(new WheelEvent('wheel', { ...at(400, 400), deltaY: -200 }));
    if (kind === 'hover') canvas.dispatchEvent(new PointerEvent('pointermove', at(380 + 7 * i, 400)));
    await frame();
    times.push(performance.now() - t);
  }
  return times.sort((a, b) => a - b);
}"""


def long_matrix(browser: Any, folder: Path, n: int) -> None:
    """Time to draw the n-token matrix overview (a head switch: pyramid and tiles rebuilt), a zoom step and a hover
    at exact cells, against the full-size image the view drew before (same page, same run)."""
    from attnscope.views import to_html

    path = folder / "long-matrix.html"
    path.write_text(to_html(long_matrix_trace(n), "matrix", theme="light"), encoding="utf-8")
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(path.as_uri())
    page.wait_for_selector(READY, state="attached", timeout=120_000)
    ready = page.evaluate("() => performance.getEntriesByName('attnscope:ready')[0].startTime")
    overview = statistics.median(page.evaluate(STEPS, "overview"))
    zooms = page.evaluate(STEPS, "zoom")  # x 2 each: from the max-pooled overview down to exact cells
    hovers = page.evaluate(STEPS, "hover")
    full = page.evaluate(FULL_IMAGE)
    page.close()
    print(f"  matrix view, {n} x {n} tokens: page ready {ready:.0f} ms; overview (head switch) {overview:.0f} ms vs "
          f"the full-size image drawn before {full:.0f} ms ({full / overview:.1f}x); zoom step median "
          f"{statistics.median(zooms):.0f} ms, max {max(zooms):.0f} ms; hover at exact cells median "
          f"{statistics.median(hovers):.0f} ms", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[64, 256, 512])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--long-matrix", type=int, default=2048, metavar="N",
                        help="tokens of the long-context matrix view timing (0: skip)")
    parser.add_argument("--only-long-matrix", action="store_true", help="only the long-context matrix timing")
    args = parser.parse_args()
    if args.only_long_matrix:
        with tempfile.TemporaryDirectory() as tmp, chromium() as browser:
            long_matrix(browser, Path(tmp), args.long_matrix)
        return
    m = attnscope.load_model()
    print(f"bench_views: {m.name}, attnscope's model view vs bertviz's model_view; sizes in MB (10^6 bytes)")
    print(f"  {'tokens':>6} {'bertviz':>9} {'ours':>7} {'ratio':>7} {'traced':>7} {'ratio':>7} {'build s':>8} "
          f"{'load s':>7} {'ready ms':>9} {'all MB':>7} {'all s':>6} {'layer ms':>9} {'hover ms':>9}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp, chromium() as browser:
        for n in args.tokens:
            r = measure(m, n, browser, Path(tmp), args.repeats)
            rows.append(r)
            print(f"  {r['tokens']:6.0f} {r['bertviz'] / 1e6:9.1f} {r['ours'] / 1e6:7.2f} "
                  f"1/{r['bertviz'] / r['ours']:<5.0f} {r['traced'] / 1e6:7.2f} 1/{r['bertviz'] / r['traced']:<5.0f} "
                  f"{r['build']:8.2f} {r['load']:7.2f} {r['ready']:9.0f} {r['all'] / 1e6:7.2f} "
                  f"{r['all_load']:6.2f} {r['layer_ms']:9.0f} {r['hover_ms']:9.0f}", flush=True)
    for r in rows:
        if r["tokens"] == 256:
            worst = max(r["ours"], r["traced"])
            print(f"  targets at 256 tokens: bytes 1/{r['bertviz'] / worst:.0f} of bertviz "
                  f"(<= 1/20: {'met' if worst * 20 <= r['bertviz'] else 'MISSED'}); "
                  f"interactive in {r['load']:.2f} s (< 2 s: {'met' if r['load'] < 2 else 'MISSED'})")
    if args.long_matrix:
        with tempfile.TemporaryDirectory() as tmp, chromium() as browser:
            long_matrix(browser, Path(tmp), args.long_matrix)


if __name__ == "__main__":
    main()
