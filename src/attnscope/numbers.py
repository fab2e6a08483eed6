"""One number format for every place a person reads a number: terminal, JSON text fields, views, app.

Values: 4 decimals (0.0394, -1.4296). Errors and tolerances: 2 significant digits in scientific
notation (5.4e-07), the badge and `check` alike. The views' JS (data.js `A.fmt`, `A.fmtError`)
follows the same rules. The scaling is written one way: "÷ sqrt(d_head) = × 1/sqrt(d_head)".
"""

from __future__ import annotations

import math

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
