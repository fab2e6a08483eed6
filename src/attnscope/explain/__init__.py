"""Explanation for a learner: the walkthrough of one layer and head with the model's own numbers
(`walkthrough`, with `seq2seq` for an encoder-decoder's kinds), its record (`steps`), its renderers
(`render`: terminal, Markdown, JSON) and the classic 3-input example (`toy`).

`from attnscope.explain import walkthrough` keeps working (this was once the module that held it); importing
this package loads neither torch nor the walkthrough until a name is used.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "walkthrough": "attnscope.explain.from_trace",
    "Walkthrough": "attnscope.explain.steps",
    "Step": "attnscope.explain.steps",
}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'attnscope.explain' has no attribute {name!r}")
