"""A search from a text: the query token's vector from the real model, then the nearest corpus tokens.

The query text is one Document through the index build's own path (stats.batching.batches, then
corpus.vectors.batch_rows), with the index's max_length, so its vectors are computed exactly as the corpus's were.
"""

from __future__ import annotations

import os

import numpy as np

from attnscope.corpus.search import SearchResult, check_query, find, matches, summary_of, vector_name
from attnscope.corpus.store import PER_HEAD, CorpusIndex
from attnscope.corpus.tags import Vocab
from attnscope.corpus.vectors import Choice, batch_rows, token_offsets
from attnscope.errors import AttnscopeError, require_text
from attnscope.models import Model, ModelLike, load_model
from attnscope.stats.batching import batches
from attnscope.stats.settings import Settings
from attnscope.stats.sources import Document


def index_model(index: CorpusIndex, model: ModelLike = None) -> Model:
    """The model the index was built with (loaded by its name), or `model` when it is that same model; another
    model is refused in one line naming both."""
    m = model if isinstance(model, Model) else load_model(model if model is not None else index.model)
    if m.name != index.model:
        raise AttnscopeError(f"{index.root} was built with {index.model}, not {m.name}: search it with "
                             f"model={index.model}, or build an index with {m.name}", parameter="model")
    return m


def query_vector(model: Model, index: CorpusIndex, text: str, token: int, layer: int, by: str,
                 head: int | None) -> tuple[np.ndarray, str]:
    """The vector of token `token` (0-indexed, special tokens included) of `text`, as the index stores its tokens'
    vectors of `by` at `layer` (and `head` for query/key); and that token's text."""
    require_text(text, "query text", parameter="text")
    settings = Settings(max_length=int(index.manifest["settings"]["max_length"]), batch_size=1)
    heads = (head,) if by in PER_HEAD and head is not None else (index.heads[0],)
    (batch,) = list(batches(model, [Document(text, "query")], settings))
    offsets = token_offsets(model, batch.docs, settings.max_length)
    n = batch.docs[0].n_tokens
    if not 0 <= token < n:
        raise AttnscopeError(f"token {token} is out of range: the query text has {n} tokens, valid values are "
                             f"0..{n - 1} (0-indexed, special tokens included)", parameter="token")
    rows, _ = batch_rows(model, batch, Choice(layers=(layer,), heads=heads), offsets, Vocab(), Vocab(), [0], 0)
    data = rows[vector_name(by, layer)][token]  # [d] or, per head, [1, d_head]
    a, b = offsets[0][token]
    shown = text[a:b] or str(model.tokenizer.convert_ids_to_tokens(batch.docs[0].ids[token]))
    return np.asarray(data[0] if by in PER_HEAD else data), shown


def search(index: CorpusIndex | str | os.PathLike[str], text: str, *, token: int, layer: int,
           by: str = "embedding", head: int | None = None, k: int = 50, model: ModelLike = None,
           exact: bool = False, verify: bool = True) -> SearchResult:
    """The k corpus tokens nearest to token `token` of `text` at `layer` (0-indexed), by `by` (embedding, context,
    query or key; query and key need `head`), with their sentences and a summary of what they are.

    exact=True searches every token (the reference); otherwise the approximate index answers when the index has
    one. verify=True checks the sha256 of each file read (an index opened from a path)."""
    ix = index if isinstance(index, CorpusIndex) else CorpusIndex(index, verify=verify)
    check_query(ix, layer, by, head)
    m = index_model(ix, model)
    vector, token_text = query_vector(m, ix, text, token, layer, by, head)
    rows, distances, method = find(ix, vector, layer=layer, by=by, head=head, k=k, exact=exact)
    found = matches(ix, rows, distances)
    return SearchResult(text=text, token=token, token_text=token_text, layer=layer, by=by, head=head, method=method,
                        matches=found, summary=summary_of(found))


__all__ = ["index_model", "query_vector", "search"]
