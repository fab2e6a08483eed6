"""Query/key maps (AttentionViz, Yeh et al. 2023) as a view: each head's queries and keys from a corpus index in one
joint 2-D scatter (corpus/maps.py: AttentionViz's normalisation, then PCA, t-SNE or UMAP), a layer's heads as small
multiples, coloured by token kind (query or key), position or UD label (a toggle); hovering a point shows its token in
its sentence.

Python builds a JSON payload (`qkmap_payload`); assets/qkmap.js draws it (`window.attnscope.renderQKMap`). The page is
self-contained (CSS and JS inlined, a CSP by hash, every text set as text), shows itself in Jupyter
(`qkmap_page(...)` is an HTMLPage), and is drawn as SVG, PNG or PDF by headless Chromium (`qkmap_figure`). Every head
of a page maps the same sampled tokens. Layers, heads and positions are 0-indexed.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from attnscope.corpus.maps import qk_map, sample_rows
from attnscope.corpus.search import check_query
from attnscope.corpus.store import CorpusIndex
from attnscope.errors import AttnscopeError
from attnscope.views.page import css, standalone, view_script

if TYPE_CHECKING:
    from attnscope.views import HTMLPage

FORMAT = "attnscope.qkmap/1"
ROOT = "attnscope-qkmap-root"
DATA = "attnscope-qkmap"
BOOT = "\nwindow.attnscope.bootQKMap();\n"
COLOURS = ("kind", "position", "upos", "deprel")  # what a point's colour says (the page's toggle)
MAX_TOKENS = 20_000  # tokens a page maps (each head draws two points per token as SVG)
DIGITS = 5  # decimals a point's coordinates keep in the page (a map's scale is ~1..100)
STYLE = """
.as-qk { font: 14px system-ui, sans-serif; margin: 12px; color: #111; }
.as-qk h2 { font-size: 17px; margin: 4px 0; }
.as-qk-note { color: #555; margin: 4px 0 10px; }
.as-qk-toggle button { font: inherit; padding: 2px 10px; }
.as-qk-toggle button[aria-pressed="true"] { background: #333; color: #fff; }
.as-qk-grid { display: flex; flex-wrap: wrap; gap: 10px; margin-top: 8px; }
.as-qk-panel svg { border: 1px solid #ddd; background: #fff; }
.as-qk-panel circle:hover { stroke: #000; stroke-width: 1.5; }
.as-qk-legend { display: flex; flex-wrap: wrap; gap: 4px 12px; margin: 6px 0; font-size: 12px; }
.as-qk-swatch { display: inline-block; width: 10px; height: 10px; border-radius: 50%; margin-right: 4px; }
.as-qk-tip { position: fixed; pointer-events: none; background: #fff; border: 1px solid #888; padding: 6px 8px;
  max-width: 460px; font-size: 13px; box-shadow: 0 2px 6px rgba(0,0,0,.2); z-index: 10; }
.as-qk-tip mark { background: #ffe08a; font-weight: 600; white-space: pre-wrap; }
.as-qk-tip .as-qk-sentence { margin-top: 4px; white-space: pre-wrap; }
"""


def token_rows(index: CorpusIndex, rows: np.ndarray) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Each sampled row's token (its text in its document, position, UD labels) and the texts of the documents they
    come from (document row -> text)."""
    cols = index.columns
    vocab = index.vocab
    documents: dict[str, str] = {}
    out = []
    for r in rows.tolist():
        doc = int(cols["doc"][r])
        key = str(doc)
        if key not in documents:
            documents[key] = str(index.document(doc)["text"])
        start, end, special = int(cols["start"][r]), int(cols["end"][r]), bool(cols["special"][r])
        upos, deprel = int(cols["upos"][r]), int(cols["deprel"][r])
        text = documents[key][start:end]
        out.append({"doc": doc, "position": int(cols["position"][r]), "start": start, "end": end,
                    "text": text if text or not special else f"⟨special {int(cols['token_id'][r])}⟩",
                    "special": special, "upos": vocab["upos"][upos] if upos >= 0 else None,
                    "deprel": vocab["deprel"][deprel] if deprel >= 0 else None})
    return out, documents


def _points(a: np.ndarray) -> list[list[float]]:
    return [[round(float(x), DIGITS), round(float(y), DIGITS)] for x, y in a]


def qkmap_payload(index: CorpusIndex, layer: int, heads: Sequence[int] | None = None, *, limit: int | None = 500,
                  seed: int = 0, method: str = "pca", colour: str = "kind") -> dict[str, Any]:
    """A JSON-serialisable description of a layer's query/key maps that `window.attnscope.renderQKMap` draws.

    heads: which of the index's kept heads (default all of them); limit: tokens sampled (seeded, the same for every
    head; None: every token); method: pca, tsne or umap; colour: the page's starting colouring (COLOURS)."""
    if colour not in COLOURS:
        raise AttnscopeError(f"colour {colour!r} is not known: choose from {', '.join(COLOURS)}", parameter="colour_by")
    if limit is not None and limit < 1:
        raise AttnscopeError(f"limit={limit} must be at least 1", parameter="limit")
    chosen = list(index.heads if heads is None else heads)
    if not chosen:
        raise AttnscopeError("no heads to map: name at least one", parameter="head")
    for head in chosen:
        check_query(index, layer, "query", head)
    rows = sample_rows(index.n_tokens, limit, seed)
    if len(rows) > MAX_TOKENS:
        raise AttnscopeError(f"{len(rows):,} tokens are too many points for a page (at most {MAX_TOKENS:,}): "
                             f"sample fewer with limit=N", parameter="limit")
    tokens, documents = token_rows(index, rows)
    maps = []
    for head in chosen:
        m = qk_map(index, layer, head, limit, seed, method)
        n = len(m.rows)
        maps.append({"layer": layer, "head": head, "queries": _points(m.points[:n]), "keys": _points(m.points[n:]),
                     "explained": None if m.explained is None else list(m.explained), "scale": m.scale})
    return {"format": FORMAT, "model": index.model, "layer": layer, "method": method, "colour": colour,
            "colours": list(COLOURS), "title": f"{index.model}: queries and keys of layer {layer} ({method})",
            "corpus": str(index.manifest["corpus"].get("spec", "")),
            "tokens": tokens, "documents": documents, "maps": maps, "sampled": len(rows),
            "total": index.n_tokens}


def page_html(data: dict[str, Any], title: str) -> str:
    """A complete page drawing one query/key map payload (CSS and JS inlined, the CSP allowing only its script)."""
    return standalone(title, view_script("qkmap.js", BOOT), css() + "\n" + STYLE, [ROOT], {DATA: data})


def qkmap_html(index: CorpusIndex | str | os.PathLike[str], layer: int, heads: Sequence[int] | None = None,
               **options: Any) -> str:
    """The maps as a self-contained HTML page (file://, no network); options as qkmap_payload's."""
    ix = index if isinstance(index, CorpusIndex) else CorpusIndex(index)
    data = qkmap_payload(ix, layer, heads, **options)
    return page_html(data, f"attnscope query/key maps: {data['title']}")


def qkmap_page(index: CorpusIndex | str | os.PathLike[str], layer: int, heads: Sequence[int] | None = None,
               **options: Any) -> HTMLPage:
    """The page as an HTMLPage: shows itself in Jupyter (an isolated iframe), .save(path) writes it."""
    from attnscope.views import HTMLPage

    ix = index if isinstance(index, CorpusIndex) else CorpusIndex(index)
    n = len(ix.heads if heads is None else heads)
    return HTMLPage(qkmap_html(ix, layer, heads, **options), height=760 if n > 1 else 680)


def qkmap_figure(index: CorpusIndex | str | os.PathLike[str], layer: int, path: str | os.PathLike[str],
                 heads: Sequence[int] | None = None, *, fmt: str | None = None, scale: float = 2.0,
                 caption: bool = True, **options: Any) -> Path:
    """The maps as a figure (svg, png or pdf, from fmt or the file's suffix), drawn by the page's own script in
    headless Chromium (as its ⤓ SVG button). scale: PNG pixels per SVG pixel."""
    from attnscope.views.figures import MAX_SCALE, figure_format, render_figure

    kind = figure_format(path, fmt)
    if not 0 < scale <= MAX_SCALE:
        raise AttnscopeError(f"scale must be above 0 and at most {MAX_SCALE:g}, got {scale:g}", parameter="scale")
    document = qkmap_html(index, layer, heads, **options)
    return render_figure(document, Path(path), kind, scale, root=ROOT, caption=caption)


__all__ = ["COLOURS", "FORMAT", "qkmap_figure", "qkmap_html", "qkmap_page", "qkmap_payload", "token_rows"]
