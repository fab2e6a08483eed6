"""The max_length rules (one validator) and the token limit a pair cannot bypass; the CLI says them as flags."""

from __future__ import annotations

import pytest

import attnscope
from attnscope.cli.main import error_line, main
from attnscope.errors import AttnscopeError
from attnscope.tokens import encode, shortest_max_length

LONG = " ".join(["word"] * 600)  # 602 tokens alone: past the model's 512 positions


@pytest.mark.parametrize(("pair", "max_length", "least"), [(None, 2, 3), ("b", 2, 5), ("b", 4, 5)])
def test_max_length_below_the_special_tokens_is_refused(minilm: attnscope.Model, pair: str | None,
                                                        max_length: int, least: int) -> None:
    with pytest.raises(AttnscopeError, match=f"max_length {max_length} is too small.*use at least {least}$") as err:
        attnscope.trace(LONG, pair, model=minilm, max_length=max_length)
    assert err.value.parameter == "max_length" and "\n" not in str(err.value)


@pytest.mark.parametrize("pair", [None, "b", "b " * 40])
def test_the_token_count_never_exceeds_max_length(minilm: attnscope.Model, pair: str | None) -> None:
    least = shortest_max_length(minilm.tokenizer, pair is not None)
    assert least == (5 if pair else 3)  # BERT: [CLS] a [SEP] b [SEP]
    for max_length in (least, least + 1, 16):
        enc = encode(minilm.tokenizer, [LONG], [pair], max_length=max_length)
        assert len(enc.tokens[0]) == max_length and enc.truncated == [True]
        segments = {t.segment for t in enc.tokens[0] if not t.special}
        assert segments == ({0, 1} if pair else {0})  # a token of each text is kept


def test_the_cli_says_the_flag_on_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["check", LONG, "--pair", "b", "--max-length", "2"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert err == ("attnscope: error: --max-length 2 is too small: a text and its pair need 3 special tokens and at "
                   "least one token of each text: use at least 5\n")


@pytest.mark.parametrize(("message", "parameter", "line"), [
    ("max_length 2 is too small", "max_length", "--max-length 2 is too small"),
    ("accept the cost with max_tokens=9", "max_tokens", "accept the cost with --max-tokens 9"),
    ("the second text (text_pair) is empty", "text_pair", "the second text (--pair) is empty"),
    ("max_body_bytes must be at least 1024; my_max_length stays", "max_body_bytes",
     "--max-body must be at least 1024; my_max_length stays"),
    ("max_length 2 is too small", None, "max_length 2 is too small"),
])
def test_error_line_maps_the_parameter_to_its_flag(message: str, parameter: str | None, line: str) -> None:
    assert error_line(AttnscopeError(message, parameter=parameter)) == line
