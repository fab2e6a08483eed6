"""One number format for every place a person reads a number: terminal, JSON text fields, views, app; and one
way to read the numbers a person writes (CLI options, head lists, headers, corpus columns): ASCII digits only.

Values: 4 decimals (0.0394, -1.4296). Errors and tolerances: 2 significant digits in scientific
notation (5.4e-07), the badge and `check` alike. The views' JS (data.js `A.fmt`, `A.fmtError`)
follows the same rules. The scaling is written one way: "÷ sqrt(d_head) = × 1/sqrt(d_head)".
"""

from __future__ import annotations

import math
import re
from typing import Any

_INTEGER = re.compile(r"[+-]?[0-9]+")
_REAL = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[+-]?(?:inf|infinity|nan)", re.IGNORECASE)

DECIMALS = 4
SCALING_RULE = "÷ sqrt(d_head) = × 1/sqrt(d_head)"


def value(v: float) -> str:
    """A value as every view shows it: 4 decimals; -inf, inf and nan as words."""
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "-inf" if v < 0 else "inf"
    return f"{v:.{DECIMALS}f}"


def error(e: float) -> str:
    """An error or tolerance: 2 significant digits, scientific (5.4e-07)."""
    return f"{e:.1e}"


def scaling(d_head: int, factor: float) -> str:
    """The scaling step in words, the standard case written as SCALING_RULE with its numbers."""
    root = math.sqrt(d_head)
    if abs(factor - 1 / root) < 1e-9:
        return (f"{SCALING_RULE}: ÷ sqrt({d_head}) = ÷ {value(root)} = × {value(1 / root)}")
    return f"× {value(factor)} (this layer's own scaling, not 1/sqrt(d_head) = {value(1 / root)})"


def is_count(text: str) -> bool:
    """A count or index written in ASCII digits: str.isdigit also accepts '²', which int() refuses, and int()
    accepts other scripts' digits ('٣'), which nobody means in a layer number."""
    return text.isascii() and text.isdigit()


def parse_int(text: str) -> int:
    """An integer in ASCII digits, optionally signed; ValueError otherwise."""
    if not _INTEGER.fullmatch(text.strip()):
        raise ValueError(f"{text!r} is not an integer (digits 0-9)")
    return int(text)


def parse_float(text: str) -> float:
    """A decimal number in ASCII (1.5, -2e-3, inf, nan); ValueError otherwise. Range checks are the caller's."""
    if not _REAL.fullmatch(text.strip()):
        raise ValueError(f"{text!r} is not a number (digits 0-9, a point, an exponent)")
    return float(text)


def finite_or_null(value: Any) -> Any:
    """NaN and infinities as None (JSON null), recursively through dicts, lists and tuples: strict JSON for every
    answer (the CLI's --format json, the web app), where a NaN stays visible as null, never 0."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_or_null(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite_or_null(v) for v in value]
    return value
