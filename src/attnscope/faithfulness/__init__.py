"""Faithfulness of attention and attribution methods over a corpus (issue 32): ERASER comprehensiveness and
sufficiency, AOPC and normalised AOPC, deletion and insertion curves, rank agreement with leave-one-out, and
random and position controls. `faithfulness(...)` runs them over a corpus (attnscope.faithfulness.run)."""

from __future__ import annotations

from typing import Any

__all__ = ["faithfulness"]


def faithfulness(*args: Any, **kwargs: Any) -> Any:
    """attnscope.faithfulness.run.faithfulness (imported on first use: this package's import stays torch-free)."""
    from attnscope.faithfulness.run import faithfulness as run

    return run(*args, **kwargs)
