"""Explanation for a learner: the walkthrough of one layer and head with the model's own numbers
(`walkthrough`, with `seq2seq` for an encoder-decoder's kinds), its record (`steps`), its renderers
(`render`: terminal, Markdown, JSON) and the classic 3-input example (`toy`).

`from attnscope.explain import walkthrough` keeps working (this was once the module that held it); importing
this package loads neither torch nor the walkthrough until a name is used.
"""

from __future__ import annotations

from attnscope import _lazy

_EXPORTS = {
    "walkthrough": "attnscope.explain.from_trace",
    "Walkthrough": "attnscope.explain.steps",
    "Step": "attnscope.explain.steps",
}


__getattr__ = _lazy.exports("attnscope.explain", _EXPORTS)
