"""Every decoder token of an encoder-decoder trace carries its decoded text, the start token and generated tokens
(known by their id only) included: the tokenizer's own decoding of the piece alone (tokens.piece_decoder)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

import attnscope
from attnscope.tokens import piece_decoder


@pytest.mark.parametrize("target", ["die katze sass", None])
def test_decoder_tokens_are_decoded_with_and_without_a_target(target: str | None,
                                                              seq2seq: Callable[[str], attnscope.Model]) -> None:
    m = seq2seq("marian")
    tr = attnscope.trace_seq2seq("the cat sat on the mat", target, model=m, max_new_tokens=4)
    decode = piece_decoder(m.tokenizer)
    assert decode is not None  # the bundled MiniLM tokenizer is a fast one
    tokens = tr.decoder.tokens
    assert tokens[0].decoded is not None  # the start token, built from its id
    assert [t.decoded for t in tokens] == [decode(t.text) for t in tokens]
    assert [t.shown for t in tokens] == [t.decoded for t in tokens]
