"""`attnscope serve`: a local web app and JSON API over traced attention.

`create_app(Settings(...))` returns a Starlette app: the page at `/`, `POST /api/trace`,
`POST /api/explain`, `GET /api/models`, `GET /healthz` and `GET /openapi.json`.
Needs the `serve` extra (starlette, uvicorn).
"""

from attnscope.serve.app import create_app
from attnscope.serve.settings import Settings

__all__ = ["Settings", "create_app"]
