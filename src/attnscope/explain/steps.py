"""The walkthrough record: Steps and a Walkthrough (torch-free, so the toy and renderers stay light).

`attnscope.explain.from_trace` fills it from a real trace, `attnscope.explain.toy` from the classic 3-input example;
`attnscope.explain.render` turns it into text, Markdown or JSON.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class Step:
    """One step: a stage name, what happens and why, its shape, and the arrays to show."""

    stage: str
    title: str
    text: str
    shape: str = ""
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    row_labels: list[str] | None = None  # labels of the first axis of each array
    col_labels: list[str] | None = None  # labels of the second axis, when they are tokens
    number: str | None = None  # the step's own number (the toy's classic 7 steps); None: counted
    array_labels: dict[str, tuple[list[str] | None, list[str] | None]] = field(default_factory=dict)
    # (row, column) labels of an array whose axes are not the step's (T5's bias table: buckets, not tokens)
    integer_cols: tuple[str, ...] = ()  # columns (by label) holding whole numbers: indices, positions


@dataclass
class Walkthrough:
    """Everything `attnscope explain` shows for one layer, head and optional query token."""

    model: dict[str, Any]
    layer: int
    head: int
    token: int | None
    tokens: list[dict[str, Any]]
    steps: list[Step]
    check: dict[str, Any]
    attention: str = "self"  # an encoder-decoder's "encoder", "decoder" or "cross" (stages.ATTENTION_KINDS)
    key_tokens: list[dict[str, Any]] | None = None  # cross-attention: the source tokens the keys run over
