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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[64, 256, 512])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
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


if __name__ == "__main__":
    main()
