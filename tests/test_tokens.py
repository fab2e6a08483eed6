"""The max_length rules (one validator) and the token limit a pair cannot bypass; the CLI says them as flags."""

from __future__ import annotations

import copy

import numpy as np
import pytest

import attnscope
from attnscope.cli.main import error_line, main
from attnscope.errors import AttnscopeError
from attnscope.tokens import Token, encode, shortest_max_length

LONG = " ".join(["word"] * 600)  # 602 tokens alone: past the model's 512 positions


@pytest.mark.parametrize(("pair", "max_length", "least"), [(None, 2, 3), (None, 0, 3), (None, -3, 3), ("b", 2, 5),
                                                         ("b", 0, 5), ("b", 4, 5)])
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


# texts that stress a tokenizer: accents, CJK, emoji, control-like whitespace, special tokens typed as text,
# markup, and texts long enough to be cut into many overflowing parts
AWKWARD = ["The capital of France is Paris.", "naïve café — Zürich, 東京 und 🙂🙂 x\u00a0y", "a\n\n\tb   c",
           "hello [SEP] there [CLS] x <|im_end|> <|endoftext|> [MASK]", "<script>alert('x')</script> &amp;",
           " ".join(["word"] * 600), "Dr. Smith's e-mail: smith@example.com, 3.14159 ... ?!" * 40]


def _expected(tok: object, texts: list[str], pairs: list[str | None], max_length: int) -> list[list[Token]]:
    """The tokens as transformers' own per-token outputs give them (offsets, special mask, word and sequence ids,
    strings from the ids), read a tensor row at a time: the reference encode's fast path must equal."""
    paired = any(p is not None for p in pairs)
    batch = tok(texts, **({"text_pair": pairs} if paired else {}), max_length=max_length,  # type: ignore[operator]
                truncation=True, padding=True, return_tensors="pt", return_offsets_mapping=True,
                return_special_tokens_mask=True)
    out = []
    for row in range(len(texts)):
        n = int(batch["attention_mask"][row].sum())
        ids, seq_ids, word_ids = batch["input_ids"][row].tolist(), batch.sequence_ids(row), batch.word_ids(row)
        strings = tok.convert_ids_to_tokens(ids)  # type: ignore[attr-defined]
        segments = batch["token_type_ids"][row].tolist() if "token_type_ids" in batch else [s or 0 for s in seq_ids]
        special, offsets = batch["special_tokens_mask"][row].tolist(), batch["offset_mapping"][row].tolist()
        words: dict[tuple[int, int], int] = {}
        row_tokens = []
        for i in range(n):
            word = None if special[i] or word_ids[i] is None else \
                words.setdefault((seq_ids[i] or 0, word_ids[i]), len(words))
            start, end = (None, None) if special[i] else tuple(offsets[i])
            row_tokens.append(Token(index=i, text=strings[i], id=ids[i], start=start, end=end, special=bool(special[i]),
                                    word=word, segment=segments[i]))
        out.append(row_tokens)
    return out


@pytest.mark.parametrize("name", ["minilm", "smollm2"])
@pytest.mark.parametrize("max_length", [3, 7, 64, 512])
def test_encode_reads_the_tokenizers_own_encodings(name: str, max_length: int,
                                                   request: pytest.FixtureRequest) -> None:
    """The tokens come from the fast tokenizer's encodings and a cut text's length from its overflowing parts;
    both must equal what transformers' per-token outputs and tokenizing each text whole give, on both real
    tokenizers (WordPiece with [CLS]/[SEP], byte-level BPE with none), single texts and pairs."""
    tok = request.getfixturevalue(name).tokenizer
    whole = [len(ids) for ids in tok(AWKWARD, truncation=False, verbose=False)["input_ids"]]
    enc = encode(tok, AWKWARD, max_length=max_length)
    assert enc.tokens == _expected(tok, AWKWARD, [None] * len(AWKWARD), max_length)
    assert enc.truncated == [n > max_length for n in whole]
    assert any(enc.truncated) and (max_length < 512 or not all(enc.truncated))  # cut and whole texts
    pairs: list[str | None] = [AWKWARD[(i + 1) % len(AWKWARD)] for i in range(len(AWKWARD))]
    if max_length >= shortest_max_length(tok, pair=True):
        assert encode(tok, AWKWARD, pairs, max_length=max_length).tokens == \
            _expected(tok, AWKWARD, pairs, max_length)


@pytest.mark.parametrize("name", ["minilm", "smollm2"])
def test_a_cut_texts_length_is_counted_whole(name: str, request: pytest.FixtureRequest,
                                             caplog: pytest.LogCaptureFixture) -> None:
    """The warning and the refusal name the length the text has whole, counted from what the tokenizer cut off."""
    tok = request.getfixturevalue(name).tokenizer
    for text in AWKWARD[-2:]:
        n = len(tok(text, truncation=False, verbose=False)["input_ids"])
        with caplog.at_level("WARNING", logger="attnscope"):
            caplog.clear()
            assert encode(tok, [text], max_length=16).truncated == [True]
        assert caplog.messages == [f"the text is {n} tokens long; keeping the first 16"]
        with pytest.raises(AttnscopeError, match=f"^the text is {n} tokens long, over the maximum of 16"):
            encode(tok, [text], max_length=16, truncate=False)


def test_a_slow_tokenizer_is_refused_in_one_line(minilm: attnscope.Model) -> None:
    """A Python tokenizer has no character offsets, word ids nor sequence ids (transformers raises a ValueError
    for sequence_ids): one line that says which tokenizer to load instead."""
    from transformers import ByT5Tokenizer  # a Python tokenizer that needs no files

    slow = attnscope.load_model(minilm.model, tokenizer=ByT5Tokenizer())
    with pytest.raises(AttnscopeError, match=r"^ByT5Tokenizer is a slow \(Python\) tokenizer: .* load the model's "
                                             r"fast tokenizer \(tokenizer.json\)$") as err:
        attnscope.trace("The capital of France is", model=slow)
    assert "\n" not in str(err.value)


def test_a_left_padding_tokenizer_still_gives_each_texts_own_tokens(minilm: attnscope.Model) -> None:
    """Decoders' tokenizers often pad on the left. A batch is padded on the right whatever the tokenizer says
    (its tokens first, then padding): before, the short text of a batch read ['[PAD]', '[PAD]', '[PAD]'] and its
    check compared padding. The tokenizer itself is left as it was."""
    tok = copy.deepcopy(minilm.tokenizer)
    tok.padding_side = "left"
    left = attnscope.load_model(minilm.model, tokenizer=tok)
    long, short = attnscope.trace(["The capital of France is Paris.", "Hi there"], model=left)
    alone = attnscope.trace("Hi there", model=minilm)
    assert [t.text for t in short.tokens] == [t.text for t in alone.tokens] == ["[CLS]", "hi", "there", "[SEP]"]
    assert long.tokens[-1].text == "[SEP]" and len(long.tokens) == 9
    assert short.check().status == long.check().status == "PASS" and tok.padding_side == "left"
    for stage in ("weights", "context"):  # the same numbers as the text traced alone, to float32 noise
        assert np.abs(short.arrays[stage] - alone.arrays[stage]).max() <= 1e-5


def test_a_left_truncating_tokenizer_keeps_and_says_the_last_tokens(minilm: attnscope.Model,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    tok = copy.deepcopy(minilm.tokenizer)
    tok.truncation_side = "left"
    text = " ".join(["word"] * 20) + " end"  # 23 tokens with [CLS] and [SEP]
    with caplog.at_level("WARNING", logger="attnscope"):
        enc = encode(tok, [text], max_length=8)
    assert [t.text for t in enc.tokens[0]] == ["[CLS]", *["word"] * 5, "end", "[SEP]"]
    assert caplog.messages == ["the text is 23 tokens long; keeping the last 8"]


def test_a_tokenizer_with_no_token_to_pad_with(smollm2: attnscope.Model) -> None:
    """Neither a padding nor an end-of-text token: one text is traced unpadded; a batch gets one line (before,
    transformers' ValueError, 'Asking to pad but the tokenizer does not have a padding token', for both)."""
    tok = copy.deepcopy(smollm2.tokenizer)
    tok.pad_token = tok.eos_token = None
    enc = encode(tok, ["Hello world"])
    assert [t.text for t in enc.tokens[0]] == ["Hello", "Ġworld"] and enc.inputs["input_ids"].shape == (1, 2)
    with pytest.raises(AttnscopeError, match=r"has neither a padding nor an end-of-text token to pad a batch with: "
                                             r"trace one text at a time, or set tokenizer.pad_token$"):
        encode(tok, ["Hello world", "Hi"])
