"""bertviz's neuron view, `show(model, model_type, tokenizer, sentence_a, ...)`, drawn by attnscope.

The tutorials' call runs with only the import changed:

    from attnscope.bertviz.neuron_view import show
    show(model, "bert", tokenizer, sentence_a, display_mode="light", layer=0, head=0)

`model` is any Hugging Face model (or a model name or local path): attnscope traces it with
its own forward pass (no vendored copy of the model), so the page carries the verification
badge, and the neuron view adds v and the weighted values to q, k, scores and weights.
"""

from __future__ import annotations

from typing import Any

from attnscope.bertviz import _finish
from attnscope.errors import AttnscopeError
from attnscope.views import HTMLPage, to_html

MODEL_TYPES = ("bert", "roberta", "gpt2")  # bertviz's neuron view knows these three


def show(
    model: Any,
    model_type: str,
    tokenizer: Any,
    sentence_a: str,
    sentence_b: str | None = None,
    display_mode: str = "dark",
    layer: int | None = None,
    head: int | None = None,
    html_action: str = "view",
) -> HTMLPage | None:
    """bertviz.neuron_view.show: the neuron view of one layer and head (0-indexed) for a sentence (pair).

    model_type is bertviz's "bert", "roberta" or "gpt2" (attnscope reads the architecture from the
    model itself, so it is only validated); display_mode "dark" or "light"; html_action "view"
    displays in Jupyter, "return" returns the page (its `.data` is the HTML).
    """
    from attnscope.models import load_model
    from attnscope.tracing.one_pass import trace

    if model_type not in MODEL_TYPES:
        raise AttnscopeError(f"model_type {model_type!r} is not one of bertviz's {', '.join(MODEL_TYPES)}; "
                             "attnscope reads the architecture from the model, so pass the nearest of them")
    if display_mode not in ("dark", "light"):
        raise AttnscopeError(f"display_mode {display_mode!r} is not known: use 'dark' or 'light'")
    tr = trace(sentence_a, sentence_b, model=load_model(model, tokenizer=tokenizer))
    tr.validate(layer=layer, head=head)
    html = to_html(tr, "neuron", layer=layer, head=head, theme=display_mode, title="attnscope neuron view")
    return _finish(tr, html, "neuron", html_action)
