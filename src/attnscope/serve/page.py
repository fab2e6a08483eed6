"""The page at `/`: a form around the views, everything inlined, data in a JSON block.

Its Content-Security-Policy allows exactly its two scripts (by hash) and connections to
this server only, so the page can fetch nothing else and no injected markup can run.
"""

from __future__ import annotations

import base64
import hashlib
import html
from functools import cache
from importlib import resources
from typing import Any

from attnscope.serve.generate import REQUEST_NEW_TOKENS
from attnscope.views import css as views_css
from attnscope.views import js as views_js
from attnscope.views.effects import STYLE as EFFECTS_STYLE
from attnscope.views.generation import STYLE as GENERATION_STYLE
from attnscope.views.page import json_for_script

DEFAULT_TEXT = "time flies like an arrow"
VIEW_CHOICES = (("all", "all views (tabs)"), ("head", "head"), ("model", "model"), ("matrix", "matrix"),
                ("neuron", "neuron"))


@cache
def _asset(name: str) -> str:
    return (resources.files("attnscope.serve") / "assets" / name).read_text(encoding="utf-8")


def _sha256(script: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode("ascii") + "'"


def policy(scripts: list[str]) -> str:
    return (f"default-src 'none'; script-src {' '.join(map(_sha256, scripts))}; style-src 'unsafe-inline'; "
            "connect-src 'self'; img-src data: blob:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


def _form() -> str:
    """The trace form. No maxlength on the text fields: a browser cuts a longer paste silently there, so
    serve.js counts the characters against the server's --max-chars and says what does not fit instead."""
    views = "".join(f'<option value="{v}">{label}</option>' for v, label in VIEW_CHOICES)
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
    modes = "".join(f'<option value="{m}">{label}</option>' for m, label in
                    (("zero", "zero (context set to 0)"), ("mean", "mean (context set to its mean)")))
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


def render(models: list[dict[str, Any]], max_chars: int) -> tuple[str, str]:
    """(the HTML page, its Content-Security-Policy header)."""
    scripts = [views_js(), _views_asset("generation.js"), _views_asset("effects.js"), _asset("serve.js")]
    config = json_for_script({"models": models, "max_chars": max_chars})
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
{_interventions_panel()}
{_generate_panel(REQUEST_NEW_TOKENS)}
<script type="application/json" id="sv-config">{config}</script>
<script>{scripts[0]}</script>
<script>{scripts[1]}</script>
<script>{scripts[2]}</script>
<script>{scripts[3]}</script>
</body>
</html>
"""
    return page, policy(scripts)
