"""Head importance over a corpus after Michel et al. 2019: the expected absolute gradient of the loss with
respect to each head's gate, I_h = E_x |dL(x)/dg_h| at g = 1, then normalised per layer (l2).

- causal LMs: L is the document's mean next-token negative log-likelihood (reverse mode, one backward
  per batch; gates per row, so each document's own gradient is summed in absolute value);
- encoders without a head: no loss exists, so I_h = E_x ||d e(x)/dg_h|| for the unit-length mean-pooled
  sentence embedding e, by forward-mode differentiation (one row per head and document).
- masked LMs: L is the mean NLL of every MASK_EVERY-th content token, each replaced by the mask token
  (deterministic, so a resumed run scores the same tokens).

Streaming: documents run in batches, the sums are checkpointed to OUTDIR every few batches, and a run
resumes where its checkpoint stopped (resume=True), refusing a checkpoint of other arguments.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from itertools import islice
from pathlib import Path
from typing import Any

import torch
import torch.autograd.forward_ad as fwAD
from torch.nn import functional as F

from attnscope.capture import intervening
from attnscope.errors import AttnscopeError
from attnscope.interventions.effects import Kind, kind_of, lm_head, mean_pool
from attnscope.interventions.gates import HeadEdit, ones
from attnscope.models import Model
from attnscope.tokens import encode

log = logging.getLogger(__name__)
CHECKPOINT = "importance-checkpoint.json"
MASK_EVERY = 7  # masked LMs: every 7th content token is masked and scored (about BERT's 15 %)


@dataclass(frozen=True)
class ImportanceSettings:
    batch_size: int = 8
    max_length: int = 128
    limit: int | None = None
    checkpoint_every: int = 10  # batches
    sample: int = 16  # documents for the pruning curve and the one-head ablations


@dataclass
class Sums:
    """What a run has accumulated: documents and tokens read, and sum over documents of |gradient|."""

    documents: int
    tokens: int
    total: list[list[float]]  # [layer, head]


def row_losses(m: Model, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """Each row's loss: [rows]. Causal LMs: the mean next-token NLL; masked LMs: the mean NLL of masked tokens."""
    return masked_losses(m, inputs) if kind_of(m) == "masked-lm" else causal_losses(m, inputs)


def masked_positions(m: Model, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """The tokens a masked LM predicts: the 1st, 8th, 15th, ... non-special real token of each row
    (every MASK_EVERY-th, deterministic, so runs and resumes agree): [rows, token] bool."""
    ids = inputs["input_ids"]
    special = torch.isin(ids, torch.tensor(m.tokenizer.all_special_ids, device=ids.device))
    content = inputs["attention_mask"].bool() & ~special
    return content & (content.cumsum(-1) % MASK_EVERY == 1)


def masked_losses(m: Model, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """Each row's mean NLL of its masked_positions' tokens, read at the mask token: [rows]."""
    chosen = masked_positions(m, inputs)
    ids = inputs["input_ids"]
    masked = torch.where(chosen, torch.full_like(ids, int(m.tokenizer.mask_token_id)), ids)
    logprobs = m.model(**{**inputs, "input_ids": masked}).logits.log_softmax(-1)  # [rows, token, vocab]
    nll = -logprobs.gather(-1, ids[..., None])[..., 0]  # [rows, token]
    scored = chosen.to(nll.dtype)
    losses: torch.Tensor = (nll * scored).sum(-1) / scored.sum(-1).clamp(min=1)
    return losses


def causal_losses(m: Model, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """Each row's mean next-token negative log-likelihood over its real tokens: [rows]."""
    h = m.model.base_model(**inputs).last_hidden_state  # [rows, token, d_model]
    logprobs = lm_head(m)(h[:, :-1]).log_softmax(-1)  # [rows, token - 1, vocab], in the model's dtype
    nll = -logprobs.gather(-1, inputs["input_ids"][:, 1:, None])[..., 0]  # [rows, token - 1]
    real = inputs["attention_mask"][:, 1:].to(nll.dtype)  # the predicted token is real
    losses: torch.Tensor = (nll * real).sum(-1) / real.sum(-1).clamp(min=1)
    return losses


def loss_gradients(m: Model, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """sum over rows of |d loss_row / d g| for a causal or masked LM: [layer, head]."""
    gates = ones(m, int(inputs["input_ids"].shape[0])).requires_grad_(True)
    edit = HeadEdit(m.n_layers, gates)
    with intervening(m.model, edit):
        losses = row_losses(m, inputs)
    (grad,) = torch.autograd.grad(losses.sum(), gates)  # [layer, row, head]: rows are independent
    return grad.abs().sum(1)


def unit_embedding(m: Model, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    h = m.model(**inputs).last_hidden_state  # [rows, token, d_model]
    return F.normalize(mean_pool(h, inputs["attention_mask"]), dim=-1)


def embedding_gradients(m: Model, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """sum over documents of ||d e / d g_h|| for an encoder, one forward-mode row per head: [layer, head]."""
    n_docs, n_layers, n_heads = int(inputs["input_ids"].shape[0]), m.n_layers, m.n_heads
    per_doc = n_layers * n_heads
    rows = {k: v.repeat_interleave(per_doc, 0) for k, v in inputs.items()}  # [doc x layer x head, token]
    tangent = torch.zeros(n_layers, n_docs * per_doc, n_heads)
    r = torch.arange(n_docs * per_doc)
    tangent[(r % per_doc) // n_heads, r, r % n_heads] = 1.0  # each row moves one head's gate
    with torch.no_grad(), fwAD.dual_level():
        edit = HeadEdit(n_layers, fwAD.make_dual(ones(m, n_docs * per_doc), tangent))  # type: ignore[no-untyped-call]
        with intervening(m.model, edit):
            e = unit_embedding(m, rows)  # [rows, d_model]
        jvp: torch.Tensor = fwAD.unpack_dual(e).tangent  # type: ignore[no-untyped-call]
    per_head: torch.Tensor = jvp.norm(dim=-1).view(n_docs, n_layers, n_heads).sum(0)
    return per_head


def gradients(m: Model, kind: Kind, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    return embedding_gradients(m, inputs) if kind == "encoder" else loss_gradients(m, inputs)


def normalised(scores: torch.Tensor) -> torch.Tensor:
    """Each layer's scores divided by their l2 norm (Michel et al. 2019); a layer of zeros stays NaN-free 0."""
    norm = scores.norm(dim=-1, keepdim=True)  # [layer, 1]
    return torch.where(norm > 0, scores / norm, scores)


def batches(texts: Iterator[str], size: int) -> Iterator[list[str]]:
    while chunk := list(islice(texts, size)):
        yield chunk


def pending(texts: Iterable[str], sums: Sums, settings: ImportanceSettings) -> Iterator[list[str]]:
    """The batches still to run: the texts after those the sums hold, up to `limit`, cut into batches."""
    return batches(islice(iter(texts), sums.documents, settings.limit), settings.batch_size)


def batch_gradients(m: Model, kind: Kind, chunk: list[str], settings: ImportanceSettings) -> tuple[int, torch.Tensor]:
    """One batch's real tokens and sum over its documents of |gradient| in float64: [layer, head].
    The one path of both engines (the local loop and each Ray worker), so their numbers agree."""
    enc = encode(m.tokenizer, chunk, max_length=settings.max_length)
    return int(enc.inputs["attention_mask"].sum()), gradients(m, kind, enc.inputs).double()


def identity(m: Model, source: dict[str, Any], settings: ImportanceSettings) -> dict[str, Any]:
    """What a resume must match: what changes the sums (not how often they are saved, nor the report's sample)."""
    summed = {k: v for k, v in asdict(settings).items() if k not in ("checkpoint_every", "sample")}
    return {"model": m.name, "source": source, "settings": summed}


def start(outdir: Path, ident: dict[str, Any], resume: bool, n_layers: int, n_heads: int) -> Sums:
    """The sums to continue from: a checkpoint of the same run (resume), or zeros in a new outdir."""
    path = outdir / CHECKPOINT
    if resume and path.is_file():
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            saved, sums = data["identity"], Sums(**data["sums"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise AttnscopeError(f"cannot read {path} ({exc}): choose another output directory") from exc
        changed = [k for k in ident if json.dumps(saved.get(k), sort_keys=True) != json.dumps(ident[k], sort_keys=True)]
        if changed:
            raise AttnscopeError(f"{path} is from a run with other arguments ({', '.join(changed)} differ): resume "
                                 "with the same arguments, or choose another output directory")
        return sums
    if not resume and outdir.exists() and (not outdir.is_dir() or any(outdir.iterdir())):
        raise AttnscopeError(f"{outdir} already exists and is not empty: pass resume=True to continue that run, "
                             "or choose another outdir", parameter="resume")
    outdir.mkdir(parents=True, exist_ok=True)
    return Sums(0, 0, [[0.0] * n_heads for _ in range(n_layers)])


def save(outdir: Path, ident: dict[str, Any], sums: Sums) -> None:
    """Write the checkpoint atomically (a kill mid-write leaves the previous one)."""
    tmp = outdir / (CHECKPOINT + ".tmp")
    tmp.write_text(json.dumps({"identity": ident, "sums": asdict(sums)}), encoding="utf-8")
    os.replace(tmp, outdir / CHECKPOINT)


def accumulate(m: Model, texts: Sequence[str] | Iterator[str], outdir: str | os.PathLike[str],
               source: dict[str, Any], settings: ImportanceSettings, resume: bool = False,
               progress: Callable[[int, int], None] | None = None) -> Sums:
    """Stream the documents in batches and sum each head's |gradient|; checkpoint as it goes."""
    kind, out = kind_of(m), Path(outdir)
    ident = identity(m, source, settings)
    sums = start(out, ident, resume, m.n_layers, m.n_heads)
    total = torch.tensor(sums.total, dtype=torch.float64)
    for n, chunk in enumerate(pending(texts, sums, settings), start=1):
        tokens, grad = batch_gradients(m, kind, chunk, settings)
        total += grad
        sums = Sums(sums.documents + len(chunk), sums.tokens + tokens, total.tolist())
        if n % settings.checkpoint_every == 0:
            save(out, ident, sums)
        if progress is not None:
            progress(sums.documents, sums.tokens)
    if sums.documents == 0:
        raise AttnscopeError("the source has no documents to read: give a file with at least one text")
    save(out, ident, sums)
    return sums
