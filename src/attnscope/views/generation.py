"""The generation view: a decoder writing, one token at a time, with each step's attention (torch-free).

Python builds a JSON payload (one entry per step: the token, its probability, the top alternatives, and
the step's query's attention over every earlier position per layer and head, plus rollout);
assets/generation.js draws it with play/pause and a step slider. The page is self-contained (file://,
Jupyter) and the web app streams the same step entries as they are generated.
"""

from __future__ import annotations

import base64
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from attnscope.errors import AttnscopeError
from attnscope.views.page import _asset, standalone
from attnscope.views.payload import token_texts

if TYPE_CHECKING:
    from attnscope.records.generation import GeneratedToken, GenerationTrace

# figure.js and export.js: the SVG/PNG download of the step shown
SCRIPTS = ("data.js", "generation.js", "figure.js", "export.js")
BOOT = "\nwindow.attnscope.bootGeneration();\n"
SOURCES = ("weights", "rollout")
LEVELS = 65535  # weights travel as uint16: w * 65535, rounded (exact to 8e-6)


def _views_fail_colour() -> str:
    """The views' red for a failed check (attnscope.css's light --fail), read from the one place it is defined."""
    found = re.search(r"--fail:\s*(#[0-9a-fA-F]{3,8})", _asset("attnscope.css"))
    if found is None:
        raise RuntimeError("attnscope.css defines no --fail colour")
    return found.group(1)


FAIL_COLOUR = _views_fail_colour()
# A failed check in the views' red: inside the views (.as-app) and the web app their own variable, which follows
# the page's theme; on the generation page alone the views' light colour
STYLE = """
.as-gen { font: 14px system-ui, sans-serif; margin: 12px; color: #111; }
.as-gen-note { color: #555; margin: 4px 0 10px; }
.as-gen-note.as-gen-fail { color: var(--fail, var(--sv-fail, FAIL)); font-weight: 600; }
.as-gen-controls { display: flex; flex-wrap: wrap; gap: 8px; align-items: center; margin-bottom: 10px; }
.as-gen-slider { width: 260px; }
.as-gen-text { font: 16px/2 ui-monospace, monospace; margin: 8px 0 14px; white-space: pre-wrap; }
.as-gen-tok { padding: 2px 1px; margin-right: 2px; border-radius: 3px; border-bottom: 2px solid transparent; }
.as-gen-prompt { border-bottom-color: #bbb; }
.as-gen-query { outline: 2px solid #333; }
.as-gen-new { outline: 2px dashed #e6550d; color: #e6550d; font-weight: 600; }
.as-gen-row { display: flex; flex-wrap: wrap; gap: 24px; }
.as-gen-bars { min-width: 280px; }
.as-gen-bar { display: grid; grid-template-columns: 110px 150px 60px; gap: 6px; align-items: center; margin: 2px 0; }
.as-gen-bar-label { font-family: ui-monospace, monospace; overflow: hidden; white-space: pre; }
.as-gen-bar-fill { background: #9ecae1; height: 12px; }
.as-gen-chosen .as-gen-bar-fill { background: #e6550d; }
.as-gen-grid { border-collapse: collapse; }
.as-gen-grid td { width: 9px; height: 14px; padding: 0; border: 1px solid #f4f4f4; }
.as-gen-grid th { font-weight: 400; color: #555; padding-right: 4px; font-size: 11px; }
.as-gen-grid thead th { writing-mode: vertical-rl; transform: rotate(180deg); padding: 2px 0; font-size: 9px;
  text-align: left; line-height: 9px; }
.as-gen-grid thead th.as-gen-corner { writing-mode: horizontal-tb; transform: none; font-size: 11px;
  vertical-align: bottom; white-space: nowrap; padding-right: 4px; }
h3 { font-size: 13px; font-weight: 600; margin: 6px 0; }
""".replace("FAIL", FAIL_COLOUR)


def quantize(rows: np.ndarray) -> str:
    """Weights in [0, 1] -> base64 of little-endian uint16 (NaN is refused: a view never hides it)."""
    if not np.isfinite(rows).all():
        raise ValueError("the step's attention holds NaN or infinity: it cannot be drawn")
    q = np.rint(np.clip(rows, 0.0, 1.0) * LEVELS).astype("<u2")
    return base64.b64encode(q.tobytes()).decode("ascii")


def token_payload(s: GeneratedToken, raw_tokens: bool = False) -> dict[str, Any]:
    """A step's token as the page shows it (also what the web app streams before the rows): token, as the tokenizer
    spells it ("Ġthe"); shown, what the page draws: the tokenizer's decoding of the piece (" the"), or the spelling
    with raw_tokens; piece, the text it added to the output. Its alternatives likewise."""
    return {"step": s.step, "position": s.position, "token": s.text, "shown": s.text if raw_tokens else s.shown,
            "piece": s.piece, "probability": s.probability,
            "alternatives": [{"token": a.text, "shown": a.text if raw_tokens else a.shown,
                              "probability": a.probability} for a in s.alternatives]}


def step_payload(g: GenerationTrace, step: int, rollout: np.ndarray | None = None,
                 raw_tokens: bool = False) -> dict[str, Any]:
    """One step: its token and the query's attention, weights [layer, head, key] and rollout [layer, key]."""
    pos = g.query_position(step)
    out = token_payload(g.steps[step], raw_tokens)
    out["keys"] = pos + 1
    out["weights"] = quantize(g.step_weights(step))  # [layer, head, key], keys 0..pos
    if rollout is not None:
        out["rollout"] = quantize(rollout[:, pos, : pos + 1])  # [layer, key]
    return out


def generation_payload(g: GenerationTrace, initial: dict[str, Any] | None = None,
                       raw_tokens: bool = False) -> dict[str, Any]:
    """The page's data; initial: the step, layer, head (None: the mean over heads) and source shown first.

    prompt_tokens: the prompt's pieces as the tokenizer spells them; prompt_shown: as the page, its tables, grid and
    figure show them: as they read (the tokenizer's decoding of each piece, " the"), or with raw_tokens as spelled
    ("Ġthe"); each step's "shown" likewise (token_payload)."""
    rollout = g.trace.rollout() if g.n_steps else None  # [layer, query, key]: causal rows need no later row
    report = g.check()
    return {
        "title": f"{g.model.get('name')}: generation from a {g.prompt_length}-token prompt",
        "model": {"name": g.model.get("name"), "layers": g.trace.n_layers, "heads": g.trace.n_heads},
        "prompt_tokens": [t.text for t in g.prompt_tokens],
        "prompt_shown": token_texts(g.prompt_tokens, raw_tokens),
        "raw_tokens": raw_tokens,
        "prompt_length": g.prompt_length,
        "settings": g.settings,
        "stopped": g.stopped,
        "check": {"ok": report.ok, "max_error": report.max_error, "tolerance": report.tolerance,
                  "unsupported": report.unsupported},
        "steps": [step_payload(g, s, rollout, raw_tokens) for s in range(g.n_steps)],
        "initial": initial or {},
    }


def initial_state(g: GenerationTrace, step: int | None = None, layer: int | None = None, head: int | None = None,
                  source: str = "weights") -> dict[str, Any]:
    """What the page shows first, validated: step, layer (default the last), head (None: the mean), source."""
    if step is not None:
        g.validate_step(step)
    g.trace.validate(layer=layer, head=head)
    if source not in SOURCES:
        raise AttnscopeError(f"source {source!r} is not drawn by the generation view: use {' or '.join(SOURCES)}")
    return {"step": step, "layer": layer, "head": "mean" if head is None else head, "source": source}


def script() -> str:
    return "\n".join(_asset(n) for n in SCRIPTS)


def generation_html(g: GenerationTrace, initial: dict[str, Any] | None = None, raw_tokens: bool = False) -> str:
    """A self-contained page: tokens appear step by step, each step's attention, its top-k bars.
    initial: initial_state(g, ...), what it shows first; raw_tokens: as generation_payload's."""
    data = generation_payload(g, initial, raw_tokens)
    return standalone(data["title"], script() + BOOT, STYLE, ["attnscope-generation-root"],
                      {"attnscope-generation": data})


def generation_page(g: GenerationTrace, raw_tokens: bool = False) -> Any:
    """The page as an HTMLPage: shows itself in Jupyter, .save(path) writes it. Tokens as they read; raw_tokens=True:
    as the tokenizer spells them ("Ġthe")."""
    from attnscope.views import HTMLPage

    return HTMLPage(generation_html(g, raw_tokens=raw_tokens), height=720)


def generation_figure(g: GenerationTrace, path: str | os.PathLike[str], *, step: int | None = None,
                      layer: int | None = None, head: int | None = None, source: str = "weights",
                      fmt: str | None = None, scale: float = 2.0, caption: bool = True,
                      raw_tokens: bool = False) -> Path:
    """One step of the generation view as a figure (svg, png or pdf, from fmt or the file's suffix): the text so
    far shaded by the step's attention (layer, head or None for the mean over heads, 0-indexed; step default
    the last), the top alternatives, and the model, step, layer, head and verification badge in the caption
    (caption=False: none). Tokens as they read (the tokenizer's decoding of each piece); raw_tokens=True: as the
    tokenizer spells them ("Ġthe")."""
    from attnscope.views.figures import MAX_SCALE, figure_format, render_figure

    kind = figure_format(path, fmt)
    if not 0 < scale <= MAX_SCALE:
        raise AttnscopeError(f"scale must be above 0 and at most {MAX_SCALE:g}, got {scale:g}")
    if not g.n_steps:
        raise AttnscopeError("this generation has no steps to draw: generate at least one token (max_new_tokens)")
    document = generation_html(g, initial_state(g, step, layer, head, source), raw_tokens)
    return render_figure(document, Path(path), kind, scale, root="attnscope-generation-root", caption=caption)
