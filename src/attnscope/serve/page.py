"""The page at `/`: a form around the views, everything inlined, data in a JSON block.

Its Content-Security-Policy allows exactly its two scripts (by hash) and connections to
this server only, so the page can fetch nothing else and no injected markup can run.
"""

from __future__ import annotations

import base64
import hashlib
import html
from collections.abc import Iterable
from functools import cache
from importlib import resources
from typing import Any

from attnscope.attribution.methods import METHODS
from attnscope.serve.faithfulness import MAX_SEEDS
from attnscope.serve.generate import REQUEST_NEW_TOKENS
from attnscope.views import css as views_css
from attnscope.views import js as views_js
from attnscope.views.attribution import STYLE as ATTRIBUTION_STYLE
from attnscope.views.effects import STYLE as EFFECTS_STYLE
from attnscope.views.generation import STYLE as GENERATION_STYLE
from attnscope.views.heads import STYLE as HEADS_STYLE
from attnscope.views.page import json_for_script
from attnscope.views.qkmap import COLOURS as QKMAP_COLOURS
from attnscope.views.qkmap import STYLE as QKMAP_STYLE

DEFAULT_TEXT = "time flies like an arrow"
VIEW_CHOICES = (("all", "all views (tabs)"), ("head", "head"), ("model", "model"), ("matrix", "matrix"),
                ("neuron", "neuron"))
# ticked at first in the attribution and faithfulness panels: one forward (or n) each, seconds on a sentence
PANEL_METHODS = ("attention", "rollout", "alti", "leave_one_out")


@cache
def _asset(name: str) -> str:
    return (resources.files("attnscope.serve") / "assets" / name).read_text(encoding="utf-8")


def _sha256(script: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode("ascii") + "'"


def policy(scripts: list[str]) -> str:
    return (f"default-src 'none'; script-src {' '.join(map(_sha256, scripts))}; style-src 'unsafe-inline'; "
            "connect-src 'self'; img-src data: blob:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


def _options(choices: Iterable[Any]) -> str:
    """<option> elements, escaped: each choice a value shown as itself, or a (value, label) pair."""
    pairs = (c if isinstance(c, tuple) else (c, c) for c in choices)
    return "".join(f'<option value="{html.escape(str(v))}">{html.escape(str(label))}</option>' for v, label in pairs)


def _form() -> str:
    """The trace form. No maxlength on the text fields: a browser cuts a longer paste silently there, so
    serve.js counts the characters against the server's --max-chars and says what does not fit instead."""
    views = _options(VIEW_CHOICES)
    return f"""<form id="sv-form" class="sv-form" autocomplete="off">
<label for="sv-text">Text<textarea id="sv-text" name="text" rows="2" required
  spellcheck="false">{html.escape(DEFAULT_TEXT)}</textarea></label>
<label for="sv-pair">Second text (optional, segment B)<input type="text" id="sv-pair" name="pair"
  spellcheck="false"></label>
<label for="sv-target" id="sv-target-label">Target (encoder-decoder model: the decoder's text; empty:
  generated)<input type="text" id="sv-target" name="target" spellcheck="false"></label>
<button type="submit" id="sv-go">Trace</button>
<div class="sv-options">
<label for="sv-model">Model<select id="sv-model" name="model"></select></label>
<label for="sv-view">View<select id="sv-view" name="view">{views}</select></label>
<label class="sv-check"><input type="checkbox" id="sv-norms" checked> norm-based</label>
<label class="sv-check"><input type="checkbox" id="sv-rollout" checked> attention rollout</label>
<label class="sv-check" title="slow beyond ~50 tokens, refused beyond 64"><input type="checkbox" id="sv-flow">
  attention flow (short texts)</label>
<span id="sv-status" role="status" aria-live="polite"></span>
</div>
</form>"""


@cache
def _views_asset(name: str) -> str:
    """A renderer the views' own pages use alone: generation.js (window.attnscope.renderGeneration), effects.js
    (window.attnscope.renderEffects, the layer x head grid of an intervention)."""
    return (resources.files("attnscope.views") / "assets" / name).read_text(encoding="utf-8")


def _interventions_panel() -> str:
    """Ablate and patch heads of the traced model: POST /api/ablate and /api/patch, drawn by serve.js with
    effects.js; a click on a grid cell opens that head in the views above."""
    modes = _options((("zero", "zero (context set to 0)"), ("mean", "mean (context set to its mean)")))
    return f"""<section id="sv-fx" class="sv-fx" aria-label="interventions">
<h2>Which heads matter: remove or patch them inside the forward pass</h2>
<details id="sv-ablate" open><summary>Ablate heads of the traced text (its model, its target)</summary>
<form id="sv-ablate-form" class="sv-form sv-fx-form" autocomplete="off">
<label for="sv-ablate-heads">Heads, layer.head (0-indexed; encoder-decoders kind:layer.head)<input type="text"
  id="sv-ablate-heads" placeholder="3.1,0.7" spellcheck="false"></label>
<label for="sv-ablate-mode">Mode<select id="sv-ablate-mode">{modes}</select></label>
<label for="sv-ablate-target" title="causal LMs: the continuation to score (empty: the greedy next token)">Target
  (causal LMs; empty: the greedy next token)<input type="text" id="sv-ablate-target" spellcheck="false"></label>
<label class="sv-check"><input type="checkbox" id="sv-ablate-each"> each head alone too (a layer × head
  grid)</label>
<label for="sv-ablate-kind" id="sv-ablate-kind-label">Grid over (encoder-decoders)<select id="sv-ablate-kind">
  <option value="cross" selected>cross-attention</option><option value="encoder">encoder self-attention</option>
  <option value="decoder">decoder self-attention</option></select></label>
<button type="submit" id="sv-ablate-go">Ablate</button>
<span id="sv-ablate-status" class="sv-fx-status" role="status" aria-live="polite"></span>
</form>
<div id="sv-ablate-out" class="sv-fx-out"></div>
</details>
<details id="sv-patch"><summary>Patch activations: clean and corrupt texts of the same length in tokens</summary>
<form id="sv-patch-form" class="sv-form sv-fx-form" autocomplete="off">
<label for="sv-patch-clean">Clean text<input type="text" id="sv-patch-clean" spellcheck="false" required
  value="The capital of France is"></label>
<label for="sv-patch-corrupt">Corrupt text<input type="text" id="sv-patch-corrupt" spellcheck="false" required
  value="The capital of Italy is"></label>
<label for="sv-patch-target">Clean answer (empty: its top token)<input type="text" id="sv-patch-target"
  spellcheck="false"></label>
<label for="sv-patch-contrast">Corrupt answer (empty: its top token)<input type="text" id="sv-patch-contrast"
  spellcheck="false"></label>
<button type="submit" id="sv-patch-go">Patch every head</button>
<span id="sv-patch-status" class="sv-fx-status" role="status" aria-live="polite"></span>
</form>
<div id="sv-patch-out" class="sv-fx-out"></div>
</details>
</section>"""


def _generate_panel(max_new_tokens: int) -> str:
    """The Generate panel (shown by serve.js when a served model is a decoder): POST /api/generate, live."""
    return f"""<section id="sv-gen" class="sv-gen" aria-label="generation" hidden>
<form id="sv-gen-form" class="sv-form sv-gen-form" autocomplete="off">
<label for="sv-gen-prompt">Prompt (a decoder continues it, one token at a time)<textarea id="sv-gen-prompt"
  rows="2" required spellcheck="false">The capital of France is</textarea></label>
<div class="sv-options">
<label for="sv-gen-model">Decoder<select id="sv-gen-model"></select></label>
<label for="sv-gen-max">Max new tokens<input type="number" id="sv-gen-max" min="1" max="{max_new_tokens}"
  value="16" required></label>
<label for="sv-gen-temperature" title="empty: greedy">Temperature<input type="number" id="sv-gen-temperature"
  min="0" max="100" step="any" placeholder="greedy"></label>
<label for="sv-gen-top-p" title="empty: all tokens">Top p<input type="number" id="sv-gen-top-p" min="0" max="1"
  step="any" placeholder="1"></label>
<label for="sv-gen-seed" title="the same seed writes the same text">Seed<input type="number" id="sv-gen-seed"
  min="0" max="4294967295" step="1" placeholder="none"></label>
<button type="submit" id="sv-gen-go">Generate</button>
<button type="button" id="sv-gen-stop" disabled>Stop</button>
<span id="sv-gen-status" class="sv-gen-status" role="status" aria-live="polite"></span>
</div>
</form>
<div id="sv-gen-view" class="sv-gen-view"></div>
</section>"""


def _method_boxes(prefix: str) -> str:
    """One checkbox per attribution method (panels.js disables those that do not apply to the chosen model)."""
    return "".join(
        f'<label class="sv-check" title="{html.escape(m.paper)}; cost: {html.escape(m.cost)}"><input type="checkbox" '
        f'name="{prefix}-method" value="{name}"{" checked" if name in PANEL_METHODS else ""}> {name}</label>'
        for name, m in METHODS.items())


def _attribution_panel() -> str:
    """Attribution of the traced text (its model; POST /api/attribute), drawn by views/assets/attribution.js; a
    head's "what this head contributes" link (panels.js) answers here too."""
    return f"""<section id="sv-attr" class="sv-panel" aria-label="attribution">
<h2>Which input tokens carry the prediction: attribution methods side by side, each beside its check</h2>
<form id="sv-attr-form" class="sv-form sv-panel-form" autocomplete="off">
<label for="sv-attr-target" id="sv-attr-target-label">Target (causal LMs and encoder-decoders: the continuation
  explained; empty: the greedy next token)<input type="text" id="sv-attr-target" spellcheck="false"></label>
<fieldset class="sv-methods" id="sv-attr-methods"><legend>Methods (the traced text, its model)</legend>
{_method_boxes("sv-attr")}</fieldset>
<button type="submit" id="sv-attr-go">Attribute</button>
<span id="sv-attr-status" class="sv-panel-status" role="status" aria-live="polite"></span>
</form>
<div id="sv-attr-out" class="sv-panel-out"></div>
</section>"""


def _faithfulness_panel() -> str:
    """Faithfulness of the traced text (POST /api/faithfulness): every method's deletion and insertion curves."""
    return f"""<section id="sv-faith" class="sv-panel" aria-label="faithfulness">
<h2>Which explanation can be trusted: deletion and insertion curves of this text, per method</h2>
<form id="sv-faith-form" class="sv-form sv-panel-form" autocomplete="off">
<fieldset class="sv-methods" id="sv-faith-methods"><legend>Methods (leave-one-out always runs: the reference;
  random and position orderings are the controls)</legend>
{_method_boxes("sv-faith")}</fieldset>
<div class="sv-options">
<label for="sv-faith-removal">Removal (special tokens never)<select id="sv-faith-removal">
  <option value="delete" selected>delete (the rest close up)</option>
  <option value="replace">replace (the baseline token)</option></select></label>
<label for="sv-faith-seeds">Random orderings<input type="number" id="sv-faith-seeds" min="1" max="{MAX_SEEDS}"
  value="3" required></label>
<button type="submit" id="sv-faith-go">Measure faithfulness</button>
<span id="sv-faith-status" class="sv-panel-status" role="status" aria-live="polite"></span>
</div>
</form>
<div id="sv-faith-out" class="sv-panel-out"></div>
</section>"""


def _search_panel(corpus: dict[str, Any] | None) -> str:
    """Corpus search (POST /api/search), only when the server loaded an index (--index)."""
    if corpus is None:
        return ""
    layers, heads, by = _options(corpus["layers"]), _options(corpus["heads"]), _options(corpus["by"])
    what = (f"{int(corpus['documents']):,} sentences, {int(corpus['tokens']):,} tokens, "
            f"{html.escape(str(corpus['model']))}")
    return f"""<section id="sv-search" class="sv-panel" aria-label="corpus search">
<h2>Search the corpus by what the model computes: the tokens nearest to one token of a text</h2>
<p class="sv-hint">The index: {what}; layers and heads 0-indexed. Click a token in the views, then "find similar
  tokens in the corpus", or ask here.</p>
<form id="sv-search-form" class="sv-form sv-panel-form" autocomplete="off">
<label for="sv-search-text">Text<input type="text" id="sv-search-text" spellcheck="false" required
  value="{html.escape(DEFAULT_TEXT)}"></label>
<div class="sv-options">
<label for="sv-search-token">Token (0-indexed, special tokens included)<input type="number" id="sv-search-token"
  min="0" value="1" required></label>
<label for="sv-search-layer">Layer<select id="sv-search-layer">{layers}</select></label>
<label for="sv-search-by">By<select id="sv-search-by">{by}</select></label>
<label for="sv-search-head" title="query and key: one head the index keeps">Head<select
  id="sv-search-head">{heads}</select></label>
<label for="sv-search-k">Matches<input type="number" id="sv-search-k" min="1" max="{int(corpus['max_k'])}"
  value="20" required></label>
<label class="sv-check"><input type="checkbox" id="sv-search-exact"> exact (every token)</label>
<button type="submit" id="sv-search-go">Search</button>
<span id="sv-search-status" class="sv-panel-status" role="status" aria-live="polite"></span>
</div>
</form>
<div id="sv-search-out" class="sv-panel-out"></div>
</section>"""


def _qkmap_panel(corpus: dict[str, Any] | None) -> str:
    """Query/key maps of the index (POST /api/qkmap), drawn by views/assets/qkmap.js; only with --index."""
    if corpus is None:
        return ""
    layers, projections, colours = _options(corpus["layers"]), _options(corpus["projections"]), _options(QKMAP_COLOURS)
    heads = _options([("", "every head (small multiples)"), *corpus["heads"]])
    return f"""<section id="sv-qkmap" class="sv-panel" aria-label="query/key map">
<h2>Query/key map: a head's queries and keys from the corpus in one 2-D space (AttentionViz)</h2>
<p class="sv-hint">Keys moved and both scaled so each query's ranking of keys is kept; hover a point for its token in
  its sentence. Layers and heads 0-indexed.</p>
<form id="sv-qkmap-form" class="sv-form sv-panel-form" autocomplete="off">
<div class="sv-options">
<label for="sv-qkmap-layer">Layer<select id="sv-qkmap-layer">{layers}</select></label>
<label for="sv-qkmap-head">Head<select id="sv-qkmap-head">{heads}</select></label>
<label for="sv-qkmap-projection" title="t-SNE needs scikit-learn, UMAP umap-learn: only those installed are
  offered">Projection<select id="sv-qkmap-projection">{projections}</select></label>
<label for="sv-qkmap-colour">Colour<select id="sv-qkmap-colour">{colours}</select></label>
<label for="sv-qkmap-limit">Tokens sampled<input type="number" id="sv-qkmap-limit" min="1"
  max="{int(corpus['max_qkmap_tokens'])}" value="300" required></label>
<button type="submit" id="sv-qkmap-go">Map</button>
<span id="sv-qkmap-status" class="sv-panel-status" role="status" aria-live="polite"></span>
</div>
</form>
<div id="sv-qkmap-out" class="sv-panel-out"></div>
</section>"""


def _heads_panel(heads: dict[str, Any] | None) -> str:
    """Heads grouped by what they do (GET/POST /api/heads), drawn by views/assets/heads.js; only with --heads. A
    click on a head sets the views' layer and head (corpus.js)."""
    if heads is None:
        return ""
    units = int(heads["layers"]) * int(heads["heads"])
    what = (f"{html.escape(str(heads['model']))}, {units} heads over {int(heads['documents']):,} sentences "
            f"({int(heads['tokens']):,} tokens)")
    return f"""<section id="sv-heads" class="sv-panel" aria-label="heads grouped by behaviour">
<h2>Heads grouped by what they do: the dendrogram and the map of the heads, with behaviour labels</h2>
<p class="sv-hint">{what}. Click a head to open it in the attention views (a text traced with this model).</p>
<form id="sv-heads-form" class="sv-form sv-panel-form" autocomplete="off">
<div class="sv-options">
<label for="sv-heads-clusters">Clusters (empty: about the square root of the heads)<input type="number"
  id="sv-heads-clusters" min="1" max="{units}"></label>
<button type="submit" id="sv-heads-go">Group</button>
<span id="sv-heads-status" class="sv-panel-status" role="status" aria-live="polite"></span>
</div>
</form>
<div id="sv-heads-out" class="sv-panel-out"></div>
</section>"""


def _methods_config() -> list[dict[str, Any]]:
    """Each method's kinds it does not apply to, with why (panels.js disables its box for such a model)."""
    return [{"name": name, "not_for": dict(m.why_not)} for name, m in METHODS.items()]


def render(models: list[dict[str, Any]], max_chars: int, corpus: dict[str, Any] | None = None,
           heads: dict[str, Any] | None = None) -> tuple[str, str]:
    """(the HTML page, its Content-Security-Policy header); corpus: the loaded index's description, if any; heads: the
    loaded heads pass's (serve.corpus_views.Heads.describe)."""
    scripts = [views_js(), _views_asset("generation.js"), _views_asset("effects.js"), _views_asset("attribution.js"),
               _views_asset("qkmap.js"), _views_asset("heads.js"), _asset("serve.js"), _asset("panels.js"),
               _asset("corpus.js")]
    config = json_for_script({"models": models, "max_chars": max_chars, "methods": _methods_config(),
                              "corpus": corpus, "heads": heads})
    page = f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>attnscope</title>
<link rel="icon" href="data:,">
<style>
{views_css()}</style>
<style>
{GENERATION_STYLE}</style>
<style>
{EFFECTS_STYLE}</style>
<style>
{ATTRIBUTION_STYLE}</style>
<style>
{QKMAP_STYLE}{HEADS_STYLE}</style>
<style>
{_asset("serve.css")}</style>
</head>
<body>
<header class="sv-top"><h1>attnscope</h1><p>type a sentence, explore every layer and head, click to see
every step (layers, heads and tokens are 0-indexed)</p></header>
{_form()}
<div class="sv-body">
<section id="sv-views" class="sv-views" aria-label="attention views"></section>
<aside id="sv-explain" class="sv-explain" aria-label="step-by-step explanation" aria-live="polite"></aside>
</div>
<nav id="sv-links" class="sv-links" aria-label="from the selection" hidden></nav>
{_search_panel(corpus)}
{_qkmap_panel(corpus)}
{_heads_panel(heads)}
{_attribution_panel()}
{_faithfulness_panel()}
{_interventions_panel()}
{_generate_panel(REQUEST_NEW_TOKENS)}
<script type="application/json" id="sv-config">{config}</script>
""" + "".join(f"<script>{script}</script>\n" for script in scripts) + """
</body>
</html>
"""
    return page, policy(scripts)
