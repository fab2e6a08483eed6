"""`attnscope serve`: a local web app and JSON API over traced attention.

`create_app(Settings(...))` returns a Starlette app: the page at `/`, `POST /api/trace`,
`POST /api/explain`, `POST /api/neuron`, `GET /api/models`, `GET /healthz` and
`GET /openapi.json`. Needs the `serve` extra (starlette, uvicorn).
Names are imported on first use, so the CLI checks its arguments before loading torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {"create_app": "attnscope.serve.app", "Settings": "attnscope.serve.settings"}

__all__ = ["Settings", "create_app"]

if TYPE_CHECKING:
    from attnscope.serve.app import create_app
    from attnscope.serve.settings import Settings


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'attnscope.serve' has no attribute {name!r}")
