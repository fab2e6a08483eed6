"""attnscope.bertviz with bertviz's encoder-decoder arguments, on a real random-weight BART's outputs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

import attnscope
from attnscope.bertviz import EMPTY_OUTPUTS, UNVERIFIED, head_view, model_view
from attnscope.errors import AttnscopeError
from tests.support.seq2seq_traces import bart
from tests.support.views import decode_source, page_payload


@pytest.fixture(scope="module")
def bart_run(minilm: attnscope.Model) -> dict[str, Any]:
    """What a bertviz user does with an encoder-decoder: run it with output_attentions and list both token lists."""
    tok = minilm.tokenizer
    model = bart(tok.vocab_size)
    src = tok("the cat sat on the mat near the door", return_tensors="pt")["input_ids"]
    tgt = tok("die katze", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        out = model(input_ids=src, decoder_input_ids=tgt, output_attentions=True)
    return {"encoder_attention": out.encoder_attentions, "decoder_attention": out.decoder_attentions,
            "cross_attention": out.cross_attentions, "encoder_tokens": tok.convert_ids_to_tokens(src[0]),
            "decoder_tokens": tok.convert_ids_to_tokens(tgt[0])}


def payloads(html: Any) -> dict[str, dict[str, Any]]:
    top = page_payload(html.data)
    return {kind: p or top for kind, p in top.get("kinds", {top["attention"]: None}).items()}


def test_head_view_draws_encoder_decoder_and_cross(bart_run: dict[str, Any]) -> None:
    kinds = payloads(head_view(**bart_run, layer=1, heads=[1], html_action="return"))
    assert list(kinds) == ["encoder", "decoder", "cross"]
    assert kinds["encoder"]["initial"]["view"] == "head" and kinds["encoder"]["initial"]["layer"] == 1
    assert kinds["encoder"]["initial"]["heads"] == [1]
    enc, dec = bart_run["encoder_tokens"], bart_run["decoder_tokens"]
    expect = {"encoder": (enc, enc), "decoder": (dec, dec), "cross": (dec, enc)}  # bertviz's left and right texts
    for kind, p in kinds.items():
        left, right = expect[kind]
        assert p["tokens"] == left and p.get("key_tokens", p["tokens"]) == right
        w = torch.stack([a[0] for a in bart_run[f"{kind}_attention"]]).numpy()  # [layer, head, query, key]
        assert p["sources"][0]["shape"] == list(w.shape)
        assert np.abs(decode_source(p["sources"][0]) - w).max() <= w.max() / 510 + 1e-7
        assert p["check"]["ok"] is None and p["check"]["unsupported"] == UNVERIFIED  # no badge claims "verified"
    assert kinds["decoder"]["causal"] is True and kinds["cross"]["causal"] is False
    assert kinds["cross"]["sources"][0]["shape"] == [3, 2, len(dec), len(enc)]


def test_model_view_with_some_of_the_kinds(bart_run: dict[str, Any]) -> None:
    only = {k: bart_run[k] for k in ("cross_attention", "encoder_tokens", "decoder_tokens")}
    kinds = payloads(model_view(**only, display_mode="light", include_heads=[1], html_action="return"))
    assert list(kinds) == ["cross"] and kinds["cross"]["heads"] == [1]
    assert kinds["cross"]["initial"]["view"] == "model" and kinds["cross"]["initial"]["theme"] == "light"
    two = {k: bart_run[k] for k in ("decoder_attention", "cross_attention", "encoder_tokens", "decoder_tokens")}
    assert list(payloads(model_view(**two, html_action="return"))) == ["decoder", "cross"]


def test_the_readme_idiom_on_an_encoder_says_what_to_pass(tiny_model: Callable[[str], attnscope.Model]) -> None:
    """bertviz's README: `attention = outputs[-1]`; in transformers 5 an encoder ends with cross_attentions=()."""
    model = tiny_model("bert")
    inputs = model.tokenizer("the cat sat", return_tensors="pt")
    with torch.no_grad():
        outputs = model.model(**inputs, output_attentions=True)
    assert outputs[-1] == ()  # the trap, as it is
    tokens = model.tokenizer.convert_ids_to_tokens(inputs["input_ids"][0])
    with pytest.raises(AttnscopeError) as caught:
        head_view(outputs[-1], tokens, html_action="return")
    assert str(caught.value) == EMPTY_OUTPUTS and "pass outputs.attentions" in EMPTY_OUTPUTS
    assert "\n" not in EMPTY_OUTPUTS
    assert head_view(outputs.attentions, tokens, html_action="return") is not None  # what it says to do works


@pytest.mark.parametrize(("change", "message"), [
    ({"encoder_tokens": None}, "encoder_tokens= is required with encoder_attention"),
    ({"encoder_attention": None, "encoder_tokens": None}, "encoder_tokens= is required with cross_attention"),
    ({"cross_attention": [torch.ones(1, 2, 3, 3)]},
     r"cross_attention has 3 x 3 positions, while there are 5 decoder_tokens and 11 encoder_tokens: .*"
     r"\(expected \(1, heads, decoder tokens, encoder tokens\)\)"),
    ({"cross_attention": [torch.ones(2, 5, 5)]},
     r"cross_attention\[0\] has shape \(2, 5, 5\): expected \(1, heads, decoder tokens, encoder tokens\)"),
    ({"decoder_attention": [torch.ones(1, 2, 3, 3)]}, r"decoder_attention has 3 x 3 positions, while there are 5 "
                                                      r"decoder_tokens"),
    ({"decoder_attention": ()}, r"decoder_attention is empty: pass one \(1, heads, decoder tokens, decoder tokens\)"),
    ({"attention": [torch.ones(1, 1, 4, 4)], "tokens": list("abcd")}, "give attention= .* not both"),
    ({"sentence_b_start": 2}, "sentence_b_start is for attention="),
])
def test_bad_encoder_decoder_arguments(bart_run: dict[str, Any], change: dict[str, Any], message: str) -> None:
    with pytest.raises(AttnscopeError, match=message):
        head_view(**(bart_run | change), html_action="return")


def test_hostile_tokens_are_escaped(bart_run: dict[str, Any]) -> None:
    evil = ["<script>alert(1)</script>", "<img src=x onerror=alert(2)>", "&amp;", "\u2028"]
    enc = bart_run["encoder_tokens"][:7] + evil
    page = head_view(**(bart_run | {"encoder_tokens": enc}), html_action="return")
    assert page is not None and "alert(1)</script>" not in page.data and "<img" not in page.data
    assert payloads(page)["cross"]["key_tokens"][-4:] == evil  # carried as they are, drawn as text
