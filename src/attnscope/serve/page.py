"""The page at `/`: a form around the views, built once per request with its own script nonce."""

from __future__ import annotations

import secrets
from typing import Any


def render(models: list[dict[str, Any]]) -> tuple[str, str]:
    nonce = secrets.token_urlsafe(16)
    policy = f"default-src 'none'; script-src 'nonce-{nonce}'; connect-src 'self'"
    return "<!doctype html><title>attnscope</title>", policy
