"""Activation patching (Wang et al. 2022): each head's context carried from the clean run into the corrupt
run (denoising) and from the corrupt run into the clean run (noising), as a layer x head grid.

The measure m is the logit difference answer - contrast at the predicting position for language models
(the answer defaults to the clean run's top token, the contrast to the corrupt run's), and for encoders the
cosine similarity of the pooled sentence embedding to the clean run's. Recovered = (m(patched) -
m(corrupt)) / (m(clean) - m(corrupt)): 1 when the head alone restores the clean behaviour.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from torch.nn import functional as F

from attnscope.capture import intervening
from attnscope.errors import AttnscopeError, require_text
from attnscope.interventions.effects import Kind, Probe, kind_of, lm_head, mean_pool, prepare
from attnscope.interventions.gates import HeadEdit, contexts, n_layers_heads, ones, run
from attnscope.models import Model, ModelLike, load_model
from attnscope.tokens import Token


@dataclass
class Patching:
    """Recovered fractions per head ([layer, head], 0-indexed) and the measures they come from."""

    model: str
    kind: Kind
    clean_tokens: list[Token]
    corrupt_tokens: list[Token]
    answer: str | None  # language models: the clean answer token and the contrast token
    contrast: str | None
    clean: float  # m(clean), m(corrupt)
    corrupt: float
    denoised: np.ndarray  # [layer, head]: recovered fraction, clean head into the corrupt run
    noised: np.ndarray  # [layer, head]: fraction of the difference lost, corrupt head into the clean run

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model, "kind": self.kind, "answer": self.answer, "contrast": self.contrast,
            "clean_tokens": [t.text for t in self.clean_tokens],
            "corrupt_tokens": [t.text for t in self.corrupt_tokens],
            "clean": self.clean, "corrupt": self.corrupt,
            "denoised": self.denoised.tolist(), "noised": self.noised.tolist(),
        }


def patch(clean: str, corrupt: str, model: ModelLike = None, target: str | None = None,
          contrast: str | None = None, max_length: int = 256) -> Patching:
    """Patch every head alone, both ways, in one batched forward pass."""
    m = load_model(model)
    require_text(clean, "clean text")
    require_text(corrupt, "corrupt text")
    if kind_of(m) == "encoder" and (target is not None or contrast is not None):
        raise AttnscopeError(f"target= and contrast= need a language-model head; {m.name} is an encoder "
                             "(patching measures the sentence embedding): leave them out")
    a, b = (_text_only(prepare(m, t, None, max_length)) for t in (clean, corrupt))
    if a.n_tokens != b.n_tokens:
        raise AttnscopeError(f"the clean text is {a.n_tokens} tokens and the corrupt text {b.n_tokens} tokens: "
                             "patching needs the same token length, so reword one of them")
    pos = _position(a)
    answer = _one_token(m, target, "target") if target is not None else (a.target_ids or [-1])[0]
    other = _one_token(m, contrast, "contrast") if contrast is not None else (b.target_ids or [-1])[0]
    if a.kind != "encoder" and answer == other:
        raise AttnscopeError(f"the answer and the contrast are the same token ({m.tokenizer.decode([answer])!r}): "
                             "give target= and contrast= that differ")
    both = {k: torch.cat([a.inputs[k], b.inputs[k]]) for k in a.inputs}
    rows, edit = patch_rows(m, both)
    with torch.no_grad():
        values = _measure(m, a, _forward(m, a.kind, rows, edit), pos, answer, other)  # [rows]
    return _result(m, a, b, values, answer, other)


def _text_only(p: Probe) -> Probe:
    """A causal LM's probe without the greedy token prepare() appended (it stays the default answer)."""
    if p.kind != "causal-lm":
        return p
    inputs = {k: v[:, :-1] for k, v in p.inputs.items()}
    return replace(p, inputs=inputs, tokens=p.tokens[:-1])


def _position(p: Probe) -> int:
    """Where the answer is read: the mask (masked LMs), the last text token (causal LMs), none (encoders)."""
    return p.positions[0] if p.positions else p.n_tokens - 1


def _forward(m: Model, kind: Kind, rows: dict[str, torch.Tensor], edit: HeadEdit) -> Any:
    """The edited forward; for causal LMs without the head (applied at one position only, in _measure)."""
    if kind != "causal-lm":
        return run(m, rows, edit)
    edit._calls = 0
    with intervening(m.model, edit):
        return m.model.base_model(**rows)


def _one_token(m: Model, text: str, what: str) -> int:
    ids = m.tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) != 1:
        raise AttnscopeError(f"the {what} {text!r} is {len(ids)} tokens: a logit difference compares "
                             f"one token with another, give a one-token {what}")
    return int(ids[0])


def patch_rows(m: Model, both: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], HeadEdit]:
    """The batch: clean, corrupt, corrupt with each clean head, clean with each corrupt head.

    both: [2, token] inputs (clean, corrupt). Returns the [2 + 2 layer head, token] inputs and their edit.
    """
    n_layers, n_heads = n_layers_heads(m)
    n = n_layers * n_heads
    order = torch.tensor([0, 1] + [1] * n + [0] * n)  # which input each row reads
    rows = {k: v[order] for k, v in both.items()}
    scale = ones(m, 2 + 2 * n)
    grid = torch.arange(n)
    for first in (2, 2 + n):
        scale[grid // n_heads, first + grid, grid % n_heads] = 0.0
    donor = 1 - order  # the other input's context flows in
    source: list[torch.Tensor | None] = [ctx[donor] for ctx in contexts(m, both)]  # [rows, head, query, d_head]
    return rows, HeadEdit(n_layers, scale, source)


def _measure(m: Model, p: Probe, out: Any, pos: int, answer: int, other: int) -> np.ndarray:
    """m per row: the logit difference, or the pooled embedding's cosine similarity to row 0 (clean)."""
    if p.kind == "encoder":
        e = mean_pool(out.last_hidden_state, torch.ones(out.last_hidden_state.shape[:2]))  # [rows, d_model]
        return F.cosine_similarity(e, e[:1], dim=-1).double().numpy()
    logits = out.logits[:, pos] if p.kind == "masked-lm" else lm_head(m)(out.last_hidden_state[:, pos])
    diff: np.ndarray = (logits[:, answer] - logits[:, other]).double().numpy()  # [rows]
    return diff


def _result(m: Model, a: Probe, b: Probe, values: np.ndarray, answer: int, other: int) -> Patching:
    n_layers, n_heads = n_layers_heads(m)
    n = n_layers * n_heads
    clean, corrupt = float(values[0]), float(values[1])
    span = clean - corrupt  # 0 gives NaN fractions: nothing to recover, and no number pretends otherwise
    with np.errstate(divide="ignore", invalid="ignore"):
        denoised = (values[2 : 2 + n] - corrupt) / span
        noised = (clean - values[2 + n :]) / span
    lm = a.kind != "encoder"
    return Patching(m.name, a.kind, a.tokens, b.tokens,
                    str(m.tokenizer.decode([answer])) if lm else None, str(m.tokenizer.decode([other])) if lm else None,
                    clean, corrupt, denoised.reshape(n_layers, n_heads), noised.reshape(n_layers, n_heads))
