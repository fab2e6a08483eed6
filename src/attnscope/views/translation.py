"""The translation view: an encoder-decoder model writing its target, each step's cross-attention over the
source (the alignment), as a self-contained page (torch-free).

Python builds a JSON payload: the source tokens, each step's token, probability and alternatives, and its
alignment [layer, head, source] (uint16, as the generation view's weights); assets/translation.js draws the
source shaded by the chosen layer's head (or the mean over heads), the target growing step by step with
play/pause and a step slider, and the alignment matrix (steps x source) of that layer and head.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from attnscope.views.generation import LEVELS, quantize, token_payload
from attnscope.views.page import _asset, standalone
from attnscope.views.payload import token_texts

if TYPE_CHECKING:
    from attnscope.records.translation import Seq2SeqGeneration

SCRIPTS = ("data.js", "translation.js")
BOOT = "\nwindow.attnscope.bootTranslation();\n"
STYLE = """
.as-tr { font: 14px system-ui, sans-serif; margin: 12px; color: #111; }
.as-tr-note { color: #555; margin: 4px 0 10px; }
.as-tr-controls { display: flex; flex-wrap: wrap; gap: 8px; align-items: center; margin-bottom: 10px; }
.as-tr-slider { width: 260px; }
.as-tr-text { font: 16px/2 ui-monospace, monospace; margin: 6px 0 10px; white-space: pre-wrap; }
.as-tr-tok { padding: 2px 1px; margin-right: 2px; border-radius: 3px; }
.as-tr-new { outline: 2px dashed #e6550d; color: #e6550d; font-weight: 600; }
.as-tr-grid { border-collapse: collapse; }
.as-tr-grid td { width: 22px; height: 16px; padding: 0; border: 1px solid #f4f4f4; }
.as-tr-grid th { font-weight: 400; color: #555; padding: 0 4px; font-family: ui-monospace, monospace; }
.as-tr-grid tr.as-tr-current th { color: #e6550d; font-weight: 600; }
h3 { font-size: 13px; font-weight: 600; margin: 6px 0; }
"""


def translation_payload(g: Seq2SeqGeneration, raw_tokens: bool = False) -> dict[str, Any]:
    """The page's data: source tokens, and per step its token and alignment [layer, head, source] (uint16). Tokens
    as they read (the tokenizer's decoding of each piece); raw_tokens: as the tokenizer spells them ("▁Haus")."""
    cross = g.trace.cross
    statuses = {kind: r.status for kind, r in g.check().items()}
    return {
        "title": f"{g.model.get('name')}: translation of a {cross.n_keys}-token source, step by step",
        "model": {"name": g.model.get("name"), "layers": cross.n_layers, "heads": cross.n_heads},
        "source_tokens": token_texts(cross.keys, raw_tokens),
        "raw_tokens": raw_tokens,
        "levels": LEVELS,
        "status": g.status(), "statuses": statuses, "stopped": g.stopped,
        "steps": [{**token_payload(s, raw_tokens), "alignment": quantize(g.alignment(s.step))} for s in g.steps],
    }


def translation_html(g: Seq2SeqGeneration, raw_tokens: bool = False) -> str:
    """A self-contained page: the target grows step by step, the source shaded by each step's alignment; tokens as
    translation_payload shows them."""
    data = translation_payload(g, raw_tokens)
    code = "\n".join(_asset(n) for n in SCRIPTS) + BOOT
    return standalone(data["title"], code, STYLE, ["attnscope-translation-root"], {"attnscope-translation": data})


__all__ = ["translation_html", "translation_payload"]
