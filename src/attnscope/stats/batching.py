"""Documents -> tokens -> length-bucketed, padded batches with the unit maps the metrics read.

`numbered_batches` is the one path from a stream of documents to batches, for the local and the
Ray engine alike: the first `limit` documents, in chunks of `chunk_documents`, each chunk
tokenized and cut into length buckets, each batch numbered (chunk, batch) in that order.

A "unit" is what a row and column of an attention map stands for: a token, or with
--word-level a word (its pieces summed as a key, averaged as a query; special tokens
stay units of their own). CoNLL-U sentences always get word units too, for the syntax.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from attnscope.errors import AttnscopeError
from attnscope.families import is_causal
from attnscope.stats.metrics import Units
from attnscope.stats.sources import Document

if TYPE_CHECKING:
    from attnscope.models import Model
    from attnscope.stats.settings import Settings

PUNCTUATION = frozenset({".", ","})
PAD_MULTIPLE = 8


@dataclass
class Prepared:
    """One tokenized document."""

    doc: Document
    ids: list[int]
    type_ids: list[int] | None
    special: list[bool]
    pieces: list[str]  # the text each token covers ("" for special tokens)
    words: list[int | None]  # word of each token (CoNLL-U: the gold word index), None for specials
    word_text: dict[int, str]
    truncated: bool

    @property
    def n_tokens(self) -> int:
        return len(self.ids)

    def units(self, word_level: bool) -> list[list[int]]:
        """Token indices of each unit, in order of first appearance."""
        if not word_level:
            return [[i] for i in range(self.n_tokens)]
        groups: dict[tuple[str, int], list[int]] = {}
        for i, word in enumerate(self.words):
            key = ("token", i) if word is None else ("word", word)
            groups.setdefault(key, []).append(i)
        return list(groups.values())


@dataclass(frozen=True)
class UnitMaps:
    """How to turn token maps into unit maps: U = mean_from @ A @ sum_to."""

    mean_from: torch.Tensor  # [batch, unit, token]: 1/pieces for each piece of the unit
    sum_to: torch.Tensor  # [batch, token, unit]: 1 where the token is a piece of the unit
    units: Units | None  # None: word maps for the syntax only, whose units' kinds are never read
    groups: list[list[list[int]]]  # per document: the token indices of each unit

    def apply(self, maps: torch.Tensor) -> torch.Tensor:
        """[batch, head, token, token] -> [batch, head, unit, unit] (two batched matmuls)."""
        b, h, t, _ = maps.shape
        u = self.sum_to.shape[-1]
        keys = maps.reshape(b, h * t, t) @ self.sum_to.to(maps.dtype)  # [batch, head * query, unit]
        keys = keys.reshape(b, h, t, u).transpose(1, 2).reshape(b, t, h * u)  # [batch, query, head * unit]
        both = self.mean_from.to(maps.dtype) @ keys  # [batch, unit, head * unit]
        return both.reshape(b, u, h, u).transpose(1, 2)  # [batch, head, unit, unit]


@dataclass(frozen=True)
class Batch:
    docs: list[Prepared]
    inputs: dict[str, torch.Tensor]  # input_ids, attention_mask[, token_type_ids]: [batch, token]
    units: Units  # what the metric maps' rows and columns are
    unit_maps: UnitMaps | None  # None: token level
    word_maps: UnitMaps | None  # word units of CoNLL-U sentences, for the syntax

    @property
    def tokens(self) -> int:
        return sum(d.n_tokens for d in self.docs)


def tokenize(tokenizer: PreTrainedTokenizerBase, docs: Sequence[Document], max_length: int) -> list[Prepared]:
    """Tokenize like attnscope.trace (special tokens added, truncated to max_length)."""
    if tokenizer.pad_token is None:  # GPT-2 style tokenizers have no pad token
        tokenizer.pad_token = tokenizer.eos_token
    if not tokenizer.is_fast:
        raise AttnscopeError(f"{type(tokenizer).__name__} is a slow tokenizer: the statistics need a fast one "
                             "(character offsets); load the model's fast tokenizer")
    texts = [d.text for d in docs]
    kwargs = {"return_offsets_mapping": True, "return_special_tokens_mask": True, "verbose": False}
    full = tokenizer(texts, truncation=False, **kwargs)
    long_rows = {i: k for k, i in enumerate(
        i for i, ids in enumerate(full["input_ids"]) if len(ids) > max_length)}
    cut = tokenizer([texts[i] for i in long_rows], truncation=True, max_length=max_length, **kwargs) \
        if long_rows else None
    out = []
    for row, doc in enumerate(docs):
        enc, r = (cut, long_rows[row]) if row in long_rows else (full, row)
        out.append(_prepared(enc, r, doc, row in long_rows))
    return out


def _prepared(enc: object, row: int, doc: Document, truncated: bool) -> Prepared:
    data = enc  # a BatchEncoding
    ids = list(data["input_ids"][row])  # type: ignore[index]
    special = [bool(s) for s in data["special_tokens_mask"][row]]  # type: ignore[index]
    offsets = [tuple(o) for o in data["offset_mapping"][row]]  # type: ignore[index]
    types = data.get("token_type_ids")  # type: ignore[attr-defined]
    pieces = ["" if s else doc.text[a:b] for (a, b), s in zip(offsets, special, strict=True)]
    if doc.words is not None:
        words, word_text = _gold_words(doc, offsets, special)
    else:
        words, word_text = _tokenizer_words(data.word_ids(row), offsets, special, doc.text)  # type: ignore[attr-defined]
    type_ids = list(types[row]) if types is not None else None
    return Prepared(doc, ids, type_ids, special, pieces, words, word_text, truncated)


def _gold_words(
    doc: Document, offsets: list[tuple[int, ...]], special: list[bool]
) -> tuple[list[int | None], dict[int, str]]:
    """Map each token to the CoNLL-U word its last character falls in (text = words joined by spaces)."""
    assert doc.words is not None
    owner: list[int | None] = []
    for w, form in enumerate(doc.words):
        owner += [w] * len(form) + [None]
    words: list[int | None] = []
    for (start, end), is_special in zip(offsets, special, strict=True):
        words.append(None if is_special or end <= start else owner[end - 1])
    return words, dict(enumerate(doc.words))


def _tokenizer_words(
    word_ids: list[int | None], offsets: list[tuple[int, ...]], special: list[bool], text: str
) -> tuple[list[int | None], dict[int, str]]:
    words: list[int | None] = []
    spans: dict[int, tuple[int, int]] = {}
    for wid, (start, end), is_special in zip(word_ids, offsets, special, strict=True):
        word = None if is_special or wid is None else int(wid)
        words.append(word)
        if word is not None:
            a, b = spans.get(word, (start, end))
            spans[word] = (min(a, start), max(b, end))
    return words, {w: text[a:b].strip() for w, (a, b) in spans.items()}


def plan(prepared: Sequence[Prepared], batch_size: int, cell_budget: int) -> list[list[int]]:
    """Length buckets: sort longest first (stable), then cut batches of at most batch_size documents
    whose padded attention map (documents x longest^2) stays within cell_budget. Longest first: the
    biggest blocks are allocated first and reused after, so the memory peak does not creep up."""
    order = sorted(range(len(prepared)), key=lambda i: -prepared[i].n_tokens)
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        longest = prepared[current[0] if current else i].n_tokens  # the batch's first is its longest
        if current and (len(current) >= batch_size or (len(current) + 1) * longest**2 > cell_budget):
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


def make_batch(docs: list[Prepared], pad_id: int, word_level: bool, causal: bool, cls_id: int | None,
               sep_id: int | None, limit: int = 0) -> Batch:
    """Right-padded model inputs plus unit maps for the metrics (and the syntax, for CoNLL-U)."""
    longest = max(d.n_tokens for d in docs)
    # Pad to a multiple of 8 (never past max(longest, limit)): few distinct shapes keep the kernels'
    # caches and the allocator's peak flat over a long run. Padding never changes a number.
    t = min(-(-longest // PAD_MULTIPLE) * PAD_MULTIPLE, max(longest, limit))
    ids = padded([d.ids for d in docs], t, pad_id, np.int64)  # [batch, token]
    inputs = {"input_ids": ids, "attention_mask": padded([[1] * d.n_tokens for d in docs], t, 0, np.int64)}
    if docs[0].type_ids is not None:
        inputs["token_type_ids"] = padded([d.type_ids or [] for d in docs], t, 0, np.int64)
    kinds = _Kinds(cls_id, sep_id, causal)
    unit_maps = unit_maps_for(docs, t, ids, kinds) if word_level else None
    units = unit_maps.units if unit_maps is not None else _token_units(docs, t, kinds, ids)
    assert units is not None  # unit maps made with kinds have units
    has_trees = docs[0].doc.heads is not None
    word_maps = (unit_maps or unit_maps_for(docs, t, ids, None)) if has_trees else None
    return Batch(docs, inputs, units, unit_maps, word_maps)


def padded(rows: Sequence[Sequence[object]], width: int, fill: object, dtype: type) -> torch.Tensor:
    """[document, width]: each document's row, filled up to width (numpy builds it from lists faster)."""
    return torch.from_numpy(np.array([[*row, *[fill] * (width - len(row))] for row in rows], dtype=dtype))


KINDS = ("cls", "sep", "punct", "sink")


@dataclass(frozen=True)
class _Kinds:
    cls_id: int | None
    sep_id: int | None
    causal: bool

    def units(self, ids: torch.Tensor, first: list[list[int]], special: list[list[bool]], text: list[list[str]],
              width: int) -> Units:
        """Units of a batch from, per document and unit: its first token, whether it is one special token,
        its text. ids: the batch's input_ids [batch, token]. Padded to width units."""
        valid = padded([[True] * len(f) for f in first], width, False, np.bool_)  # [batch, unit]
        first_token = padded(first, width, 0, np.int64)
        one_special = padded(special, width, False, np.bool_)
        punct = padded([[not s and t.strip() in PUNCTUATION for s, t in zip(ss, ts, strict=True)]
                         for ss, ts in zip(special, text, strict=True)], width, False, np.bool_)
        token_id = ids.gather(1, first_token)  # [batch, unit]
        none = torch.zeros_like(valid)
        flags = {
            "cls": one_special & (token_id == self.cls_id) if self.cls_id is not None and not self.causal else none,
            "sep": one_special & (token_id == self.sep_id) if self.sep_id is not None and not self.causal else none,
            "punct": punct,
            "sink": valid & (first_token == 0) if self.causal else none,
        }
        rows = valid.clone()
        if self.causal:
            rows[:, 0] = False  # row 0 can only attend to itself
        return Units(valid, rows, {k: flags[k] for k in KINDS}, self.causal)


def _token_units(docs: list[Prepared], width: int, kinds: _Kinds, ids: torch.Tensor) -> Units:
    first = [list(range(d.n_tokens)) for d in docs]
    return kinds.units(ids, first, [d.special for d in docs], [d.pieces for d in docs], width)


def unit_maps_for(docs: list[Prepared], width: int, ids: torch.Tensor, kinds: _Kinds | None) -> UnitMaps:
    """Word units of a batch; with kinds, also what each unit is (cls, sep, punct, sink)."""
    groups = [d.units(word_level=True) for d in docs]
    n_units = max(len(g) for g in groups)
    doc_of: list[int] = []  # per token of the batch: its document, its unit and the pieces of that unit
    unit_of: list[int] = []
    pieces_of: list[int] = []
    for b, (d, doc_groups) in enumerate(zip(docs, groups, strict=True)):
        owner = [0] * d.n_tokens
        for u, tokens in enumerate(doc_groups):
            for t in tokens:
                owner[t] = u
        doc_of += [b] * d.n_tokens
        unit_of += owner
        pieces_of += [len(doc_groups[u]) for u in owner]
    token_of = [t for d in docs for t in range(d.n_tokens)]
    b_, u_, t_ = (torch.from_numpy(np.array(x, dtype=np.int64)) for x in (doc_of, unit_of, token_of))
    mean_from = torch.zeros((len(docs), n_units, width), dtype=torch.float32)
    mean_from[b_, u_, t_] = torch.from_numpy((1.0 / np.array(pieces_of, dtype=np.float64)).astype(np.float32))
    sum_to = torch.zeros((len(docs), width, n_units), dtype=torch.float32)
    sum_to[b_, t_, u_] = 1.0
    if kinds is None:
        return UnitMaps(mean_from, sum_to, None, groups)
    first = [[g[0] for g in doc_groups] for doc_groups in groups]
    pairs = list(zip(docs, groups, strict=True))
    special = [[len(g) == 1 and d.special[g[0]] for g in doc_groups] for d, doc_groups in pairs]
    text = [[_word_text(d, g[0]) for g in doc_groups] for d, doc_groups in pairs]
    return UnitMaps(mean_from, sum_to, kinds.units(ids, first, special, text, n_units), groups)


def _word_text(d: Prepared, token: int) -> str:
    word = d.words[token]
    return d.word_text[word] if word is not None else ""


Key = tuple[int, int]  # (chunk, batch): a batch's place in a run


def chunks(docs: Iterable[Document], limit: int | None, size: int) -> Iterator[list[Document]]:
    """The first `limit` documents (all with None), `size` at a time."""
    stream = iter(docs) if limit is None else itertools.islice(docs, limit)
    while chunk := list(itertools.islice(stream, size)):
        yield chunk


def numbered_batches(model: Model, docs: Iterable[Document], settings: Settings,
                     start: Key = (0, 0)) -> Iterator[tuple[Key, Batch]]:
    """A run's batches from `start` on, each with its (chunk, batch) number."""
    for c, chunk in enumerate(chunks(docs, settings.limit, settings.chunk_documents)):
        if c < start[0]:
            continue
        skip = start[1] if c == start[0] else 0
        for j, batch in enumerate(batches(model, chunk, settings, skip=skip)):
            yield (c, skip + j), batch


def batches(model: Model, docs: Sequence[Document], settings: Settings, skip: int = 0) -> Iterator[Batch]:
    """The length-bucketed batches of one list of documents (one chunk), from the skip-th on."""
    if not docs:
        return
    tok = model.tokenizer
    prepared = tokenize(tok, docs, settings.max_length)
    if not settings.truncate:
        for p in prepared:
            if p.truncated:
                raise AttnscopeError(f"{p.doc.where}: the document is over {settings.max_length} tokens: "
                                     "raise max_length, or set truncate=True to truncate it", parameter="max_length")
    causal = is_causal(model.model)
    pad = int(tok.pad_token_id if tok.pad_token_id is not None else 0)
    for idx in plan(prepared, settings.batch_size, settings.budget)[skip:]:
        if len({prepared[i].doc.heads is None for i in idx}) > 1:
            raise AttnscopeError("a corpus mixes documents with and without dependency trees")
        yield make_batch([prepared[i] for i in idx], pad, settings.word_level, causal,
                         tok.cls_token_id, tok.sep_token_id, settings.max_length)
