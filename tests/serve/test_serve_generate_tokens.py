"""The Generate panel's start line shows each prompt token as it reads (issue 29): the tokenizer's own decoding of
the piece, SmolLM2's byte-level marks (Ġ, Ċ) decoded, before the first step arrives."""

from __future__ import annotations

import attnscope
from attnscope.serve.generate import _start


def test_the_start_line_shows_each_prompt_token_as_the_tokenizer_decodes_it(smollm2: attnscope.Model) -> None:
    pieces = [str(t) for t in smollm2.tokenizer.convert_ids_to_tokens(smollm2.tokenizer("Hello big\nworld")
                                                                        ["input_ids"])]
    start = _start(smollm2, pieces)
    assert "Ġbig" in start["prompt_tokens"] and "Ċ" in start["prompt_tokens"]
    assert start["prompt_shown"] == [smollm2.tokenizer.convert_tokens_to_string([p]) for p in pieces]
    assert " big" in start["prompt_shown"] and "\n" in start["prompt_shown"]
