"""Text -> tokens: ids, strings, character offsets, special-token flags, word ids, segments."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from attnscope.errors import AttnscopeError, require_text

if TYPE_CHECKING:  # the Token record is read by views of saved traces, without torch
    import torch
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class Token:
    """One token of a traced text. Offsets index the text of its segment (0: text, 1: pair); a token with no
    place in a text (generated, or given as ids) has none."""

    index: int
    text: str
    id: int
    start: int | None = None
    end: int | None = None
    special: bool = False
    word: int | None = None  # word index over the whole input (pieces of one word share it)
    segment: int = 0  # 0 for the first text, 1 for the pair
    # the tokenizer's own decoding of this piece alone (" world" for GPT-2's "Ġworld", "\n" for "Ċ"); None when not
    # known (a trace saved before this field, or a token made without its tokenizer): then `text` is what is shown
    decoded: str | None = field(default=None, compare=False)  # derived from text: equality stays as it was

    @property
    def shown(self) -> str:
        """The token as a person reads it: the tokenizer's decoding of the piece when known, else the piece."""
        return self.text if self.decoded is None else self.decoded

    def to_dict(self) -> dict[str, Any]:
        # its fields are plain values: a shallow dict is dataclasses.asdict without its deep copy (30x faster,
        # 14 ms for 256 tokens in every /api/trace answer)
        return dict(self.__dict__)


@dataclass
class Encoded:
    """A padded batch ready for the model, and each row's unpadded tokens."""

    inputs: dict[str, torch.Tensor]  # input_ids, attention_mask[, token_type_ids]: [batch, token]
    tokens: list[list[Token]]
    truncated: list[bool]


def encode(
    tokenizer: PreTrainedTokenizerBase,
    texts: Sequence[str],
    pairs: Sequence[str | None] | None = None,
    max_length: int = 256,
    truncate: bool = True,
    as_target: bool = False,
) -> Encoded:
    """Tokenize texts (and optional second sentences) as one right-padded batch, whatever the tokenizer's padding
    side. A text longer than max_length is cut on the tokenizer's truncation side (the warning names the end kept).

    as_target: as an encoder-decoder's labels (the tokenizer's target mode: Marian's target vocabulary)."""
    pairs = list(pairs) if pairs is not None else [None] * len(texts)
    for text, pair in zip(texts, pairs, strict=True):
        require_text(text)
        if pair is not None:
            require_text(pair, "second text (text_pair)", parameter="text_pair")
    paired = any(p is not None for p in pairs)
    validate_max_length(tokenizer, max_length, pair=paired)
    if not tokenizer.is_fast:  # a Python tokenizer gives no character offsets, word ids nor sequence ids
        raise AttnscopeError(f"{type(tokenizer).__name__} is a slow (Python) tokenizer: attnscope needs a fast one "
                             "for each token's characters and word; load the model's fast tokenizer (tokenizer.json)")
    if tokenizer.pad_token is None:  # GPT-2 style tokenizers have no pad token
        tokenizer.pad_token = tokenizer.eos_token
    if tokenizer.pad_token is None and len(texts) > 1:  # one text needs no padding
        raise AttnscopeError(f"{type(tokenizer).__name__} has neither a padding nor an end-of-text token to pad a "
                             "batch with: trace one text at a time, or set tokenizer.pad_token")
    key = "text_target" if as_target else "text"
    # the encodings hold every token's string, offsets and flags: only ids and masks become tensors. Padding goes
    # on the right whatever the tokenizer's own side (decoders' are often left): a row's tokens come first
    batch = tokenizer(**{key: list(texts)}, **({"text_pair": list(pairs)} if paired else {}), max_length=max_length,
                      truncation=True, padding=len(texts) > 1, padding_side="right", return_tensors="pt")
    kept = batch["attention_mask"].sum(dim=1).tolist()  # [text]: tokens kept
    if max(kept) > max_length:  # the tokenizer could not truncate this far: never trace more than asked
        raise AttnscopeError(f"the tokenizer kept {max(kept)} tokens, over max_length {max_length}: "
                             "raise max_length or shorten the text", parameter="max_length")
    lengths = _lengths(tokenizer, batch, kept, texts, pairs, key, max_length)
    kept_end = "last" if tokenizer.truncation_side == "left" else "first"  # the tokenizer's side is kept
    truncated = [_too_long(n, max_length, truncate, kept_end) for n in lengths]
    decode = piece_decoder(tokenizer)
    tokens = [_tokens_of(enc, n, "token_type_ids" in batch, decode)
              for enc, n in zip(batch.encodings, kept, strict=True)]
    keep = ("input_ids", "attention_mask", "token_type_ids")
    return Encoded({k: batch[k] for k in keep if k in batch}, tokens, truncated)


def _lengths(tok: PreTrainedTokenizerBase, batch: Any, kept: list[int], texts: Sequence[str],
             pairs: list[str | None], key: str, max_length: int) -> list[int]:
    """Each text's token count before truncation (kept, for a text the tokenizer did not cut)."""
    if key == "text" and not any(p is not None for p in pairs):
        # a single text cut to max_length: what was cut off is in its encoding's overflowing parts, each of them
        # a window of the text's tokens that the tokenizer framed with its special tokens as it did the first
        # (tests/test_tokens.py checks the count against tokenizing the text whole)
        specials = int(tok.num_special_tokens_to_add(pair=False))
        return [n + sum(sum(part.attention_mask) - specials for part in enc.overflowing)
                for n, enc in zip(kept, batch.encodings, strict=True)]
    # a text shorter than max_length was kept whole; only those at the limit are counted untruncated
    full = [i for i, n in enumerate(kept) if n >= max_length]
    counted = _untruncated_lengths(tok, [texts[i] for i in full], [pairs[i] for i in full], key)
    lengths = dict(zip(full, counted, strict=True))
    return [lengths.get(i, n) for i, n in enumerate(kept)]


def _untruncated_lengths(tok: PreTrainedTokenizerBase, texts: Sequence[str], pairs: list[str | None],
                         key: str = "text") -> list[int]:
    """Each text's token count with special tokens, before any truncation (one batched call); key "text_target"
    counts labels."""
    with_pairs = [i for i, p in enumerate(pairs) if p is not None]
    alone = [i for i, p in enumerate(pairs) if p is None]
    lengths = [0] * len(texts)
    for rows, args in ((alone, ([texts[i] for i in alone],)),
                       (with_pairs, ([texts[i] for i in with_pairs], [pairs[i] for i in with_pairs]))):
        if rows:
            named = dict(zip((key, "text_pair"), args, strict=False))
            ids = tok(**named, truncation=False, verbose=False)["input_ids"]
            for i, row_ids in zip(rows, ids, strict=True):
                lengths[i] = len(row_ids)
    return lengths


DEFAULT_MAX_LENGTH = 256  # tokens, special ones included, unless the model reads fewer positions


def fitting_max_length(positions: int) -> int:
    """The default max_length for a model that reads `positions` positions: the smaller of the two."""
    return min(DEFAULT_MAX_LENGTH, positions)


def shortest_max_length(tokenizer: PreTrainedTokenizerBase, pair: bool) -> int:
    """The least max_length that keeps a token of each text besides the tokenizer's special tokens."""
    return int(tokenizer.num_special_tokens_to_add(pair=pair)) + (2 if pair else 1)


def validate_max_length(tokenizer: PreTrainedTokenizerBase, max_length: int, pair: bool | None = False,
                        positions: int | None = None, model: str = "this model") -> int:
    """max_length itself, or a one-line error: too small for the special tokens (of a text, or of a
    text and its pair; pair=None skips this), or more than the model's `positions`.

    The one place the max_length rules live (tracing, encoding and the web app use it).
    """
    if isinstance(max_length, bool) or not isinstance(max_length, int):
        raise AttnscopeError(f"max_length must be an integer, got {max_length!r}", parameter="max_length")
    # pair None skips the special tokens' rule, except below 1 token, where the advice must hold for a text alone
    least = 1 if pair is None and max_length >= 1 else shortest_max_length(tokenizer, bool(pair))
    if max_length < least:
        what = "a text and its pair need" if pair else "a text needs"
        which = "each text" if pair else "the text"
        raise AttnscopeError(
            f"max_length {max_length} is too small: {what} {least - (2 if pair else 1)} special tokens and "
            f"at least one token of {which}: use at least {least}", parameter="max_length")
    if positions is not None and max_length > positions:
        raise AttnscopeError(f"max_length {max_length} exceeds what {model} can read ({positions} positions): "
                             f"use at most {positions}", parameter="max_length")
    return max_length


def _too_long(n: int, max_length: int, truncate: bool, kept_end: str) -> bool:
    if n <= max_length:
        return False
    if not truncate:
        raise AttnscopeError(f"the text is {n} tokens long, over the maximum of {max_length}: shorten it or "
                             "raise max_length", parameter="max_length")
    log.warning("the text is %d tokens long; keeping the %s %d", n, kept_end, max_length)
    return True


def piece_decoder(tokenizer: PreTrainedTokenizerBase) -> Callable[[str], str] | None:
    """The tokenizer's own decoding of one piece alone, as its convert_tokens_to_string([piece]) gives it
    ("Ġworld" -> " world", "Ċ" -> "\n", WordPiece's "##ing" stays "##ing"); None for a tokenizer without a
    decoder (a slow one)."""
    decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
    if decoder is None:
        return None
    seen: dict[str, str] = {}

    def decode(piece: str) -> str:
        if piece not in seen:
            seen[piece] = str(decoder.decode([piece]))
        return seen[piece]

    return decode


def _tokens_of(enc: Any, n: int, type_ids: bool, decode: Callable[[str], str] | None = None) -> list[Token]:
    """The first n (unpadded) tokens of one row of a right-padded batch, from the fast tokenizer's encoding of
    that row (one list per field, not a tensor index per token). type_ids: the model reads token_type_ids, which
    then number the segments (else the sequence ids do). decode: each piece's readable text (piece_decoder)."""
    ids, strings, offsets, special, seq_ids, word_ids = (
        enc.ids, enc.tokens, enc.offsets, enc.special_tokens_mask, enc.sequence_ids, enc.word_ids)
    segments = enc.type_ids if type_ids else [s or 0 for s in seq_ids]
    words: dict[tuple[int, int], int] = {}
    out: list[Token] = []
    for i in range(n):
        is_special = bool(special[i])
        word = None
        if not is_special and word_ids[i] is not None:
            word = words.setdefault((seq_ids[i] or 0, word_ids[i]), len(words))
        start, end = (None, None) if is_special else offsets[i]
        out.append(Token(index=i, text=strings[i], id=ids[i], start=start, end=end, special=is_special, word=word,
                         segment=segments[i], decoded=None if decode is None else decode(strings[i])))
    return out
