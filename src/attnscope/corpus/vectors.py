"""One batch through the real model -> the index's rows: per token its place, labels, vectors and attention summary.

The batch comes from the corpus statistics' one path (attnscope.stats.batching): padded and length-bucketed. Each
chosen layer's attention call (attnscope.capture.recording) gives q, k, the weights and the context; the hidden
states come from the model's own output_hidden_states. Rows are the batch's real tokens, document by document,
token by token (padding dropped), so a token's vectors do not depend on its neighbours in the batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from attnscope import maths
from attnscope.capture import AttentionCall, recording
from attnscope.corpus.tags import Vocab, word_labels
from attnscope.errors import AttnscopeError
from attnscope.models import Model
from attnscope.stats.batching import Batch, Prepared


@dataclass(frozen=True, kw_only=True)
class Choice:
    """What an index keeps: the layers (all vectors) and, at each, the heads (q, k, attention summary); 0-indexed."""

    layers: tuple[int, ...]
    heads: tuple[int, ...]


class _Recorder:
    """Keeps, for the chosen layers, q and k of the chosen heads, the merged context and the attention summary."""

    def __init__(self, choice: Choice, valid: torch.Tensor, special: torch.Tensor):
        self.choice, self.valid, self.special = choice, valid, special  # [batch, token] bool each
        self.layer = 0
        self.rows: dict[str, np.ndarray] = {}

    def on_attention(self, call: AttentionCall) -> None:
        layer, self.layer = self.layer, self.layer + 1
        if layer not in self.choice.layers:
            return
        heads = list(self.choice.heads)
        groups = int(call.q.shape[1]) // int(call.k.shape[1])
        k = maths.expand_kv(call.k, groups)[:, heads]  # [batch, head, key, d_head]
        rows = {
            "query": call.q[:, heads].transpose(1, 2),  # [batch, token, head, d_head]
            "key": k.transpose(1, 2),
            "context": call.context.transpose(1, 2).flatten(2),  # [batch, token, head * d_head]
            **summary(call.weights[:, heads], self.special),
        }
        for name, t in rows.items():
            self.rows[f"{name}.l{layer}"] = on_host(t[self.valid])  # [token, ...] of real tokens only


def summary(weights: torch.Tensor, special: torch.Tensor) -> dict[str, torch.Tensor]:
    """Each query's attention row in three numbers: its entropy (nats), the offset (key - query) it attends to
    most, and the share of its weight on special tokens. weights [batch, head, query, key]; -> [batch, token, head]."""
    w = weights.detach().to(torch.float32)
    entropy = torch.special.entr(w).sum(-1)  # 0 log 0 = 0
    query = torch.arange(w.shape[-2], device=w.device).view(1, 1, -1)
    top = w.argmax(-1) - query  # [batch, head, query]
    share = w @ special.to(w.dtype)[:, None, :, None]  # [batch, head, query, key] @ [batch, 1, key, 1]
    return {"entropy": entropy.transpose(1, 2), "top_offset": top.transpose(1, 2).to(torch.int32),
            "special_share": share.squeeze(-1).transpose(1, 2)}


def on_host(t: torch.Tensor) -> np.ndarray:
    """A tensor as the index stores it: on the CPU, float32 (or its integer type), contiguous."""
    t = t.detach().cpu()
    return (t.to(torch.float32) if t.is_floating_point() else t).contiguous().numpy()


def batch_rows(model: Model, batch: Batch, choice: Choice, offsets: list[list[tuple[int, int]]],
               upos: Vocab, deprel: Vocab, numbers: list[int],
               first_doc: int) -> tuple[dict[str, np.ndarray], list[dict[str, Any]]]:
    """One batch's token rows (every token array of the index) and its documents' lines (documents.jsonl).
    offsets: each document's tokens' character spans; numbers: each document's place in the corpus; first_doc:
    the row of documents.jsonl its first document gets."""
    valid = batch.inputs["attention_mask"].bool()  # [batch, token]
    special = torch.zeros_like(valid)
    for b, d in enumerate(batch.docs):
        special[b, : d.n_tokens] = torch.tensor(d.special, dtype=torch.bool)
    rec = _Recorder(choice, valid.to(model.device), special.to(model.device))
    with torch.inference_mode(), recording(model.model, rec):
        out = model.base(**{k: v.to(model.device) for k, v in batch.inputs.items()}, output_hidden_states=True)
    if rec.layer != model.n_layers:
        raise AttnscopeError(f"saw {rec.layer} attention calls for a model of {model.n_layers} layers")
    rows: dict[str, np.ndarray] = dict(rec.rows)
    for layer in choice.layers:  # the hidden state layer L hands on (transformers' hidden_states[L + 1])
        rows[f"embedding.l{layer}"] = on_host(out.hidden_states[layer + 1][valid.to(model.device)])
    rows.update(_token_columns(batch.docs, offsets, upos, deprel, first_doc))
    return rows, [_document_line(d, n) for d, n in zip(batch.docs, numbers, strict=True)]


def _token_columns(docs: list[Prepared], offsets: list[list[tuple[int, int]]], upos: Vocab,
                   deprel: Vocab, first_doc: int) -> dict[str, np.ndarray]:
    cols: dict[str, list[int]] = {k: [] for k in ("doc", "position", "token_id", "start", "end", "special", "word",
                                                  "upos", "deprel")}
    for row, (d, spans) in enumerate(zip(docs, offsets, strict=True), start=first_doc):
        tags, relations = word_labels(d.doc)
        for i in range(d.n_tokens):
            word = d.words[i] if d.doc.words is not None else None
            cols["doc"].append(row)
            cols["position"].append(i)
            cols["token_id"].append(d.ids[i])
            cols["start"].append(spans[i][0])
            cols["end"].append(spans[i][1])
            cols["special"].append(int(d.special[i]))
            cols["word"].append(-1 if word is None else word)
            cols["upos"].append(upos.code(tags[word] if tags is not None and word is not None else None))
            cols["deprel"].append(deprel.code(relations[word] if relations is not None and word is not None else None))
    return {k: np.asarray(v, dtype=np.int64) for k, v in cols.items()}


def _document_line(d: Prepared, number: int) -> dict[str, Any]:
    line: dict[str, Any] = {"number": number, "where": d.doc.where, "text": d.doc.text, "tokens": d.n_tokens,
                            "truncated": d.truncated}
    if d.doc.words is not None:
        line["words"] = list(d.doc.words)
    return line


def token_offsets(model: Model, docs: list[Prepared], max_length: int) -> list[list[tuple[int, int]]]:
    """Each document's tokens' character spans in its text, from the model's fast tokenizer (as the batch's)."""
    enc = model.tokenizer([d.doc.text for d in docs], return_offsets_mapping=True, truncation=True,
                          max_length=max_length, verbose=False)
    out = []
    for d, spans in zip(docs, enc["offset_mapping"], strict=True):
        if len(spans) != d.n_tokens:
            raise AttnscopeError(f"{d.doc.where}: the tokenizer gave {len(spans)} offsets for {d.n_tokens} tokens")
        out.append([(int(a), int(b)) for a, b in spans])
    return out


__all__ = ["Choice", "batch_rows", "summary", "token_offsets"]
