"""The skeleton and style of attnscope's static report pages (`stats` and `faithfulness` report.html), defined once.

Torch-free and import-light, so a torch-free page (faithfulness.report_page) can use it: the pages are
self-contained (inline CSS, images as data: URLs, no scripts) and their policy forbids fetching anything.
"""

from __future__ import annotations

import html

# Nothing may load from the network: no scripts at all, images only from data: URLs.
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"

CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2rem auto; max-width: 72rem; padding: 0 1rem; color: #222; }
h1 { font-size: 1.5rem; } h2 { font-size: 1.2rem; margin-top: 2rem; }
table { border-collapse: collapse; margin: .5rem 0; }
th, td { border: 1px solid #ccc; padding: .2rem .5rem; text-align: right; }
th { background: #f3f3f3; } td.l, th.l { text-align: left; }
.grid { display: flex; flex-wrap: wrap; gap: 1rem; } .note { color: #555; font-size: .9rem; }
"""

FIGURES_CSS = """
figure { margin: 0; } figcaption { font-size: .85rem; color: #555; }
img { max-width: 34rem; height: auto; border: 1px solid #eee; }
"""


def document(title: str, css: str, body: str) -> str:
    """A complete static report page: the one skeleton of both report.html files. The title is escaped here; body
    is HTML whose values the caller has escaped. The CSP lets nothing run or load but inline CSS and data: images."""
    return ("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
            f"<title>{html.escape(title)}</title><style>{css}</style></head><body>{body}</body></html>\n")
