"""attnscope.bertviz with bertviz's own arguments: the output_attentions of real models and their tokens."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

import attnscope
from attnscope.bertviz import UNVERIFIED, head_view, model_view
from attnscope.errors import AttnscopeError
from attnscope.views import HTMLPage
from tests.support.views import decode_block, decode_source, page_payload


def run(model: attnscope.Model, *texts: str) -> tuple[tuple[torch.Tensor, ...], list[str], Any]:
    """What a bertviz user does: run the model with output_attentions and list the tokens."""
    inputs = model.tokenizer(*texts, return_tensors="pt")
    with torch.no_grad():
        out = model.model(**inputs, output_attentions=True)
    return out.attentions, model.tokenizer.convert_ids_to_tokens(inputs["input_ids"][0]), inputs


@pytest.fixture(scope="module")
def bert_run(minilm: attnscope.Model) -> tuple[tuple[torch.Tensor, ...], list[str], Any]:
    return run(minilm, "The cat sat on the mat.", "It was tired.")


def test_head_view_draws_the_given_attention(bert_run: Any) -> None:
    attention, tokens, inputs = bert_run
    b_start = inputs["token_type_ids"][0].tolist().index(1)
    page = head_view(attention, tokens, b_start, html_action="return")
    assert isinstance(page, HTMLPage) and page.data.startswith("<!doctype html>")
    data = page_payload(page.data)
    expected = torch.stack([a[0] for a in attention]).numpy()
    assert np.abs(decode_source(data["sources"][0]) - expected).max() <= expected.max() / 510 + 1e-9
    assert data["tokens"] == tokens and data["initial"]["view"] == "head"
    assert data["segments"] == [int(i >= b_start) for i in range(len(tokens))]
    assert data["check"]["ok"] is None and data["check"]["unsupported"] == UNVERIFIED  # no badge claims "verified"
    assert data["neuron"] == {"blocks": [], "complete": False, "available": False}
    assert data["special"][0] and data["special"][b_start - 1] and not data["special"][1]  # [CLS], [SEP], "the"


def test_bertviz_options_map_onto_the_views(bert_run: Any) -> None:
    attention, tokens, _ = bert_run
    data = page_payload(head_view(attention, tokens, layer=4, heads=[1, 3], include_layers=[2, 4],
                                  html_action="return").data)  # type: ignore[union-attr]
    assert data["layers"] == [2, 4] and data["initial"]["layer"] == 4 and data["initial"]["heads"] == [1, 3]
    data = page_payload(model_view(attention, tokens, display_mode="light", include_layers=[0, 5],
                                   include_heads=[7], html_action="return").data)  # type: ignore[union-attr]
    assert data["layers"] == [0, 5] and data["heads"] == [7] and data["initial"]["theme"] == "light"
    assert data["sources"][0]["shape"] == [2, 1, len(tokens), len(tokens)]
    assert data["initial"]["view"] == "model"


def test_causal_attention_is_recognised(tiny_model: Callable[[str], attnscope.Model]) -> None:
    attention, tokens, _ = run(tiny_model("gpt2"), "the cat sat on the mat")
    data = page_payload(model_view(attention, tokens, html_action="return").data)  # type: ignore[union-attr]
    assert data["causal"] is True and data["initial"]["theme"] == "dark"  # bertviz's model_view defaults to dark


def test_prettify_tokens_as_bertviz_does() -> None:
    tokens = ["<|endoftext|>", "Ġthe", "▁cat", "sat</w>"]
    weights = [torch.full((1, 2, 4, 4), 0.25)]
    assert page_payload(head_view(weights, tokens, html_action="return").data)["tokens"] == [  # type: ignore[union-attr]
        "<|endoftext|>", " the", " cat", "sat"]
    raw = page_payload(head_view(weights, tokens, prettify_tokens=False, html_action="return").data)  # type: ignore[union-attr]
    assert raw["tokens"] == tokens and raw["special"] == [True, False, False, False]


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"tokens": ["a", "b"]}, r"attention has 3 x 3 positions, while there are 2 tokens"),
    ({"tokens": None}, "tokens= is required"),
    ({"attention": [torch.ones(2, 1, 3, 3)]}, r"attention\[0\] holds a batch of 2: pass one example"),
    ({"attention": [torch.ones(1, 3, 3)]}, r"attention\[0\] has shape \(1, 3, 3\)"),
    ({"attention": []}, "attention is empty"),
    ({"attention": None}, "no attention given"),
    ({"attention": None, "encoder_attention": [torch.ones(1, 1, 3, 3)], "cross_attention": [torch.ones(1, 1, 3, 3)],
      "encoder_tokens": ["a", "b", "c"], "tokens": None}, "decoder_tokens= is required with cross_attention"),
    ({"layer": 1, "include_layers": [0]}, r"layer 1 is not in this view: it shows layers \[0\]"),
    ({"sentence_b_start": 4}, "sentence_b_start 4 is outside the 3 tokens"),
    ({"html_action": "print"}, "html_action 'print' is not known"),
    ({"html_action": "view"}, r"show\(\) displays in Jupyter"),
])
def test_bad_arguments_are_one_clear_error(kwargs: dict[str, Any], message: str) -> None:
    args: dict[str, Any] = {"attention": [torch.full((1, 1, 3, 3), 1 / 3)] * 2, "tokens": ["a", "b", "c"],
                            "html_action": "return"}
    with pytest.raises(AttnscopeError, match=message):
        head_view(**(args | kwargs))


def test_encoder_attention_alone_is_self_attention() -> None:
    enc = [torch.softmax(torch.randn(1, 2, 3, 3, generator=torch.Generator().manual_seed(0)), -1)]
    data = page_payload(head_view(encoder_attention=enc, encoder_tokens=["x", "y", "z"],
                                  html_action="return").data)  # type: ignore[union-attr]
    assert data["tokens"] == ["x", "y", "z"]
    assert np.abs(decode_source(data["sources"][0])[0] - enc[0][0].numpy()).max() <= 1 / 510 + 1e-7


TUTORIAL = '''
from transformers import BertModel, BertTokenizer
from attnscope.bertviz.neuron_view import show  # the one changed line: was `from bertviz.neuron_view import show`

model_version = MODEL_PATH
model = BertModel.from_pretrained(model_version, output_attentions=True)
tokenizer = BertTokenizer.from_pretrained(model_version, do_lower_case=True)
sentence_a = "The cat sat on the mat"
sentence_b = "The cat lay on the rug"
html = show(model, "bert", tokenizer, sentence_a, sentence_b, display_mode="light", layer=0, head=0,
            html_action="return")
'''


def test_the_tutorials_neuron_view_call_runs_with_only_the_import_changed(minilm: attnscope.Model) -> None:
    from attnscope.models import bundled_model_path

    scope: dict[str, Any] = {"MODEL_PATH": str(bundled_model_path())}  # offline: the bundled BERT-family model
    exec(TUTORIAL, scope)  # the tutorial's own code, as a learner runs it
    data = page_payload(scope["html"].data)
    assert data["initial"] == {**data["initial"], "view": "neuron", "layer": 0, "head": 0, "theme": "light"}
    assert data["check"]["ok"] is True  # traced from the model itself: verified, unlike weights passed in
    assert data["tokens"][:3] == ["[CLS]", "the", "cat"] and 1 in data["segments"]
    block = data["neuron"]["blocks"][0]
    assert (block["layer"], block["head"]) == (0, 0) and block["stages"][-2:] == ["v", "context"]
    tr = attnscope.trace("The cat sat on the mat", "The cat lay on the rug", model=minilm)
    got = decode_block(block, tr.n_tokens)
    assert np.array_equal(got["weights"], tr.weights[0, 0]) and np.array_equal(got["v"], tr.arrays["v"][0, 0])


def test_neuron_view_show_rejects_unknown_options(minilm: attnscope.Model) -> None:
    from attnscope.bertviz.neuron_view import show

    with pytest.raises(AttnscopeError, match="model_type 'xlnet' is not one of bertviz's"):
        show(minilm.model, "xlnet", minilm.tokenizer, "hi")
    with pytest.raises(AttnscopeError, match="head 12 is out of range"):
        show(minilm.model, "bert", minilm.tokenizer, "hi", head=12, html_action="return")
