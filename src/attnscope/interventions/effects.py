"""What an intervention changes in the model's output, measured per batch row against an untouched row.

- causal LMs: the log-probability of a target continuation (default: the model's own greedy next
  token) and the loss (mean next-token negative log-likelihood over text + target);
- masked LMs: the log-probability of the target at the first mask token (default: the model's top
  prediction there);
- encoders without a head (all-MiniLM-L6-v2): the cosine distance of the mean-pooled sentence embedding
  (the pooling sentence-transformers uses for that model) and each token's relative final-state change.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from torch.nn import functional as F

from attnscope.errors import AttnscopeError
from attnscope.families import is_causal, is_encoder_decoder
from attnscope.interventions.gates import HeadEdit
from attnscope.models import Model
from attnscope.tokens import Token, encode

Kind = Literal["causal-lm", "masked-lm", "encoder", "seq2seq-lm"]
HEAD_CHUNK_BYTES = 2**27  # log-probabilities of at most 128 MiB at a time
PRIMARY = {"causal-lm": "d_target_logprob", "masked-lm": "d_target_logprob", "encoder": "embedding_distance",
           "seq2seq-lm": "d_target_logprob"}


def kind_of(m: Model) -> Kind:
    """How effects are read: through the language-model head, or from the final hidden states."""
    if is_encoder_decoder(m.model):  # three kinds of attention call per forward: ablate reads them (seq2seq.py)
        raise AttnscopeError(f"ablate works on encoder-decoder models like {m.name} "
                             f"({m.model.config.model_type}), patch, knockout and importance not yet: ablate its "
                             "heads (kind:layer.head), or trace, check or explain it")
    if lm_head(m) is None:
        return "encoder"
    return "causal-lm" if is_causal(m.model) else "masked-lm"


def lm_head(m: Model) -> Any:
    """The output projection to the vocabulary (None for an encoder without a head)."""
    return m.model.get_output_embeddings()  # type: ignore[no-untyped-call]


@dataclass
class Probe:
    """One text ready for interventions: the model inputs [1, token], its tokens and the target read."""

    model: Model
    kind: Kind
    inputs: dict[str, torch.Tensor]
    tokens: list[Token]
    target_ids: list[int]  # LMs: the target tokens; encoders: none
    positions: list[int]  # the positions whose prediction is each target token

    @property
    def n_tokens(self) -> int:
        return int(self.inputs["input_ids"].shape[1])

    @property
    def target(self) -> str | None:
        return str(self.model.tokenizer.decode(self.target_ids)) if self.target_ids else None

    def rows(self, n: int) -> dict[str, torch.Tensor]:
        """The inputs repeated for a batch of n rows (one per edit setting)."""
        return {k: v.expand(n, -1).contiguous() for k, v in self.inputs.items()}


def prepare(m: Model, text: str, target: str | None = None, max_length: int = 256) -> Probe:
    """Tokenize text (plus the target continuation for causal LMs) and settle the target."""
    kind = kind_of(m)
    enc = encode(m.tokenizer, [text], max_length=max_length, truncate=False)
    inputs, tokens = enc.inputs, enc.tokens[0]
    if kind == "encoder":
        if target is not None:
            raise AttnscopeError(f"target= needs a model with a language-model head; {m.name} is an encoder "
                                 "(its effects are the sentence embedding's change): leave the target out")
        return Probe(m, kind, inputs, tokens, [], [])
    if kind == "masked-lm":
        return _masked_probe(m, inputs, tokens, target)
    ids = _target_ids(m, target) if target is not None else [greedy_next(m, inputs)]
    n = len(tokens)
    inputs = _appended(inputs, ids)
    if inputs["input_ids"].shape[1] > m.max_positions:
        raise AttnscopeError(f"text and target are {inputs['input_ids'].shape[1]} tokens, over the "
                             f"{m.max_positions} positions {m.name} reads: shorten them")
    extra = [Token(index=n + i, text=s, id=t)
             for i, (t, s) in enumerate(zip(ids, m.tokenizer.convert_ids_to_tokens(ids), strict=True))]
    return Probe(m, kind, inputs, tokens + extra, ids, [n - 1 + i for i in range(len(ids))])


def _target_ids(m: Model, target: str) -> list[int]:
    ids = [int(i) for i in m.tokenizer(target, add_special_tokens=False)["input_ids"]]
    if not ids:
        raise AttnscopeError(f"the target {target!r} tokenizes to nothing: give a target with at least one token")
    return ids


def _appended(inputs: dict[str, torch.Tensor], ids: list[int]) -> dict[str, torch.Tensor]:
    """The inputs with the target tokens appended: [1, token + target]."""
    more = torch.tensor([ids], dtype=inputs["input_ids"].dtype)
    out = {"input_ids": torch.cat([inputs["input_ids"], more], 1),
           "attention_mask": torch.cat([inputs["attention_mask"], torch.ones_like(more)], 1)}
    if "token_type_ids" in inputs:
        out["token_type_ids"] = torch.cat([inputs["token_type_ids"], torch.zeros_like(more)], 1)
    return out


def _masked_probe(m: Model, inputs: dict[str, torch.Tensor], tokens: list[Token], target: str | None) -> Probe:
    mask_id = m.tokenizer.mask_token_id
    where = (inputs["input_ids"][0] == mask_id).nonzero().flatten().tolist() if mask_id is not None else []
    if not where:
        raise AttnscopeError(f"the text has no mask token: write {m.tokenizer.mask_token} where the word "
                             f"to predict goes (a masked language model reads the target there)")
    if target is None:
        with torch.no_grad():
            ids = [int(m.model(**inputs).logits[0, where[0]].argmax())]
    else:
        ids = _target_ids(m, target)
        if len(ids) != 1:
            raise AttnscopeError(f"the target {target!r} is {len(ids)} tokens: a masked language model "
                                 "predicts one token at the mask, give a one-token target")
    return Probe(m, "masked-lm", inputs, tokens, ids, where[:1])


def greedy_next(m: Model, inputs: dict[str, torch.Tensor]) -> int:
    """The causal LM's most likely next token after the inputs."""
    with torch.no_grad():
        h = m.model.base_model(**inputs).last_hidden_state[:, -1]  # [1, d_model]
        return int(lm_head(m)(h).argmax(-1)[0])


def outputs(probe: Probe, inputs: dict[str, torch.Tensor], edit: HeadEdit | None) -> dict[str, torch.Tensor]:
    """One forward pass over a batch of rows (each with its edit): the measures of each row."""
    from attnscope.capture import intervening

    m = probe.model
    edit_ctx: Any = intervening(m.model, edit) if edit is not None else contextlib.nullcontext()
    if edit is not None:
        edit._calls = 0
    with edit_ctx:
        if probe.kind == "encoder":
            h = m.model(**inputs).last_hidden_state  # [rows, token, d_model]
            return {"embedding": mean_pool(h, inputs["attention_mask"]), "hidden": h}
        if probe.kind == "masked-lm":
            logits = m.model(**inputs).logits[:, probe.positions]  # [rows, target, vocab]
            return {"target_logprob": _picked(logits.log_softmax(-1), probe.target_ids)}
        h = m.model.base_model(**inputs).last_hidden_state  # [rows, token, d_model]
    return causal_measures(m, h, inputs["input_ids"], probe.positions, probe.target_ids)


def mean_pool(h: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Mean over real tokens: [rows, token, d_model], [rows, token] -> [rows, d_model]."""
    w = keep.to(h.dtype)[..., None]  # [rows, token, 1]
    return (h * w).sum(1) / w.sum(1).clamp(min=1e-9)


def _picked(logprobs: torch.Tensor, ids: list[int]) -> torch.Tensor:
    """Sum over target tokens of log p(target): [rows, target, vocab] -> [rows]."""
    idx = torch.tensor(ids, device=logprobs.device)[None, :, None].expand(logprobs.shape[0], -1, 1)
    return logprobs.gather(-1, idx)[..., 0].sum(-1)


def causal_measures(m: Model, h: torch.Tensor, ids: torch.Tensor, positions: list[int],
                    target_ids: list[int]) -> dict[str, torch.Tensor]:
    """The target's log-probability and the loss per row, the LM head applied a few rows at a time."""
    head = lm_head(m)
    n_rows, n_tok = int(h.shape[0]), int(h.shape[1])
    step = max(1, HEAD_CHUNK_BYTES // (4 * n_tok * int(head.weight.shape[0])))
    target, loss = [], []
    for i in range(0, n_rows, step):
        logprobs = head(h[i:i + step]).float().log_softmax(-1)  # [rows, token, vocab]
        target.append(_picked(logprobs[:, positions], target_ids))
        nll = -logprobs[:, :-1].gather(-1, ids[i:i + step, 1:, None])[..., 0]  # [rows, token - 1]
        loss.append(nll.mean(-1))
    return {"target_logprob": torch.cat(target), "loss": torch.cat(loss)}


def effects(kind: Kind, measures: dict[str, torch.Tensor], clean: int = 0) -> dict[str, np.ndarray]:
    """Each row's measures and their change against the untouched row `clean`, as float64 arrays."""
    with torch.no_grad():
        if kind == "encoder":
            e, h = measures["embedding"], measures["hidden"]  # [rows, d_model], [rows, token, d_model]
            distance = 1 - F.cosine_similarity(e, e[clean : clean + 1], dim=-1)
            change = (h - h[clean : clean + 1]).norm(dim=-1) / h[clean : clean + 1].norm(dim=-1)  # [rows, token]
            out = {"embedding_distance": distance, "token_change": change, "mean_token_change": change.mean(-1)}
        else:
            out = {}
            for name, v in measures.items():
                out[name], out[f"d_{name}"] = v, v - v[clean]
        return {k: v.detach().double().numpy() for k, v in out.items()}
