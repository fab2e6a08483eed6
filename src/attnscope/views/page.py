"""One self-contained page: CSS and JS inlined, the payload in a `<script type="application/json">` block.

The page loads nothing: a Content-Security-Policy allows only its own script (by hash), so
even markup that slipped into it could neither run nor fetch anything.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
from collections.abc import Mapping, Sequence
from functools import cache
from importlib import resources
from typing import Any

# Concatenated in this order: data decoding first, the app shell (which uses every view) last.
SCRIPTS = ("data.js", "lazy.js", "controls.js", "head.js", "tiles.js", "matrix.js", "model.js", "neuron.js",
           "selection.js", "figure.js", "export.js", "neuron-figure.js", "app.js")
STYLES = ("attnscope.css",)
BOOT = "\nwindow.attnscope.boot();\n"


@cache
def _asset(name: str) -> str:
    return (resources.files("attnscope.views") / "assets" / name).read_text(encoding="utf-8")


def css() -> str:
    """The views' stylesheet."""
    return "\n".join(_asset(n) for n in STYLES)


def js() -> str:
    """The views' script: defines `window.attnscope` (render, decode, views); runs nothing by itself."""
    return "\n".join(_asset(n) for n in SCRIPTS)


def bundle() -> str:
    """`<style>` and `<script>` tags to inline into any page that renders payloads (the web app)."""
    return f"<style>\n{css()}</style>\n<script>\n{js()}</script>\n"


def json_for_script(data: Any) -> str:
    """JSON that cannot close its `<script>` block or open a comment: <, >, & and line separators escaped."""
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    for ch, esc in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"),
                    ("\u2029", "\\u2029")):
        text = text.replace(ch, esc)
    return text


def _csp(script: str) -> str:
    digest = base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode("ascii")
    return (f"default-src 'none'; script-src 'sha256-{digest}'; style-src 'unsafe-inline'; "
            "img-src data: blob:; base-uri 'none'; form-action 'none'")


def view_script(asset: str, boot: str) -> str:
    """The views' script, one more view's asset (from views/assets/) after it, and the line that boots that view."""
    return js() + "\n" + _asset(asset) + boot


def standalone(title: str, script: str, style: str, roots: Sequence[str], data: Mapping[str, Any]) -> str:
    """A complete HTML document that runs `script` when opened, from a file or in an iframe: the one skeleton of
    every standalone page. roots: the ids of the empty elements it draws into, in order; data: the id of each
    `<script type="application/json">` block -> its payload, in order. The title is escaped, the payloads cannot
    close their blocks (json_for_script), and the CSP lets only this script run (by hash) and nothing load."""
    blocks = "".join(f"<script type=\"application/json\" id=\"{html.escape(block_id)}\">{json_for_script(payload)}"
                     "</script>\n" for block_id, payload in data.items())
    divs = "".join(f"<div id=\"{html.escape(root)}\"></div>\n" for root in roots)
    return (
        "<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        f"<meta http-equiv=\"Content-Security-Policy\" content=\"{_csp(script)}\">\n"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
        f"<title>{html.escape(title)}</title>\n<style>\n{style}</style>\n</head>\n<body>\n"
        f"{divs}{blocks}<script>{script}</script>\n</body>\n</html>\n"
    )


def page(data: dict[str, Any], title: str) -> str:
    """A complete HTML document that renders `data` (a payload) when opened, from a file or in an iframe."""
    return standalone(title, js() + BOOT, css(), ["attnscope-root"], {"attnscope-data": data})
