"""Trace a real model on a text: capture, recompute, and keep everything for checks and views."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, overload

import torch
from transformers import PreTrainedTokenizerBase

from attnscope import families
from attnscope.capture import LayerCapture, capturing
from attnscope.errors import AttnscopeError
from attnscope.maths import AttentionParams
from attnscope.models import DeviceLike, DtypeLike, Model, ModelLike, describe_capture, load_model
from attnscope.placement import on_host
from attnscope.records.trace import Trace
from attnscope.tokens import Encoded, encode, fitting_max_length, validate_max_length
from attnscope.tracing.rows import row_arrays
from attnscope.verify import check as checking
from attnscope.verify.recompute import layer_params


@overload
def trace(  # type: ignore[overload-overlap]
    text: str, text_pair: str | None = ..., model: ModelLike = ..., max_length: int | None = ...,
    truncate: bool = ..., tokenizer: PreTrainedTokenizerBase | None = ..., recompute: bool = ...,
    device: DeviceLike = ..., dtype: DtypeLike = ...,
) -> Trace: ...
@overload
def trace(
    text: Sequence[str], text_pair: Sequence[str | None] | None = ..., model: ModelLike = ...,
    max_length: int | None = ..., truncate: bool = ..., tokenizer: PreTrainedTokenizerBase | None = ...,
    recompute: bool = ..., device: DeviceLike = ..., dtype: DtypeLike = ...,
) -> list[Trace]: ...


def trace(
    text: str | Sequence[str],
    text_pair: str | Sequence[str | None] | None = None,
    model: ModelLike = None,
    max_length: int | None = None,
    truncate: bool = True,
    tokenizer: PreTrainedTokenizerBase | None = None,
    recompute: bool = True,
    device: DeviceLike = None,
    dtype: DtypeLike = None,
) -> Trace | list[Trace]:
    """Run the model on text (or a list of texts, as one padded batch) and trace its attention.

    text_pair gives second sentences (segment B, with token_type_ids). max_length counts tokens
    including special tokens (default: the smaller of 256 and the positions the model reads); longer texts
    are truncated with a warning unless truncate=False, which makes them an error. recompute=False keeps
    only what the forward pass captured (no independent recompute, no norm-based attention). device and
    dtype place the model (see load_model); the trace's arrays and the check are float32 on the CPU either way.
    """
    pending = forward_pass(text, text_pair, model, max_length, truncate, tokenizer, recompute, device, dtype)
    traces = pending.finish()
    return traces[0] if isinstance(text, str) else traces


@dataclass
class ForwardPass:
    """A forward pass done, its check not yet: what `forward_pass` captured, on the host, with everything read from
    the model (its layers' weights, its own outputs, its description). `finish` needs the model no more, so a
    server can run the next forward pass while this one is checked (attnscope.serve.service)."""

    texts: list[str]
    pairs: list[str | None] | None
    enc: Encoded
    layers: dict[str, list[torch.Tensor]]  # stage -> [batch, ...] per layer
    params: list[AttentionParams] | None
    reference: dict[str, list[torch.Tensor]] | None  # the model's own outputs (None: no recompute)
    info: dict[str, Any]
    scaling: list[float]
    unsupported: str | None

    def finish(self) -> list[Trace]:
        """Recompute and check every layer (when asked for), then one Trace per text."""
        table = None
        if self.reference is not None:
            table = checking.verify_batch(self.layers, self.reference, self.params, self.enc.inputs["attention_mask"])
        w_o = [p.w_o.numpy() for p in self.params] if self.params is not None else None
        lengths = [len(t) for t in self.enc.tokens]
        pairs = self.pairs or [None] * len(self.texts)
        return [
            Trace(model=self.info, text=t, pair=p, tokens=self.enc.tokens[row],
                  arrays=row_arrays(self.layers, row, lengths[row]), scaling=self.scaling,
                  truncated=self.enc.truncated[row], comparisons=table.comparisons(row) if table else [],
                  unsupported=self.unsupported, output_projection=w_o)
            for row, (t, p) in enumerate(zip(self.texts, pairs, strict=True))
        ]


def forward_pass(
    text: str | Sequence[str],
    text_pair: str | Sequence[str | None] | None = None,
    model: ModelLike = None,
    max_length: int | None = None,
    truncate: bool = True,
    tokenizer: PreTrainedTokenizerBase | None = None,
    recompute: bool = True,
    device: DeviceLike = None,
    dtype: DtypeLike = None,
) -> ForwardPass:
    """The part of `trace` that runs the model (same arguments): tokenize, capture in one forward pass, read
    the layers' weights and the model's own outputs. `trace` is forward_pass(...).finish()."""
    m, texts, pairs, enc = prepare(text, text_pair, model, max_length, truncate, tokenizer, device, dtype)
    with torch.no_grad(), capturing(m.model) as cap:
        inputs = {k: v.to(m.device) for k, v in enc.inputs.items()}
        # the transformer without its LM head: a trace needs no logits ([batch, token, vocab], 200 MB for SmolLM2)
        out = m.base(**inputs, output_attentions=recompute, output_hidden_states=recompute)
    require_calls(m, cap)
    layers = on_host(per_layer(cap))  # stage -> [batch, ...] per layer
    params = on_host(layer_params(m.model, int(enc.inputs["input_ids"].shape[1]))) if recompute else None
    reference = on_host(model_outputs(m, out, len(cap.calls))) if recompute else None
    return ForwardPass(texts, pairs, enc, layers, params, reference, model_info(m, cap, params),
                   [c.scaling for c in cap.calls], _why_unverified(m, recompute, params, layers))


def prepare(
    text: str | Sequence[str], text_pair: str | Sequence[str | None] | None, model: ModelLike,
    max_length: int | None, truncate: bool, tokenizer: PreTrainedTokenizerBase | None = None,
    device: DeviceLike = None, dtype: DtypeLike = None,
) -> tuple[Model, list[str], list[str | None] | None, Encoded]:
    """forward_pass's first step (same arguments): the model loaded, the texts and pairs as lists, tokenized."""
    texts = [text] if isinstance(text, str) else list(text)
    if not texts:
        raise AttnscopeError("no text given: pass a sentence or a non-empty list of sentences")
    pairs: list[str | None] | None
    if isinstance(text, str):
        pairs = [text_pair] if isinstance(text_pair, str) or text_pair is None else list(text_pair)
    else:
        pairs = list(text_pair) if text_pair is not None and not isinstance(text_pair, str) else None
    m = load_model(model, tokenizer, device=device, dtype=dtype)
    if families.is_encoder_decoder(m.model):
        raise AttnscopeError(f"{m.name} ({m.architecture}) is an encoder-decoder model: trace a source and a target "
                             "with attnscope.trace_seq2seq(source, target=...)")
    max_length = _usable_max_length(m, max_length, pairs is not None and any(p is not None for p in pairs))
    enc = encode(m.tokenizer, texts, pairs, max_length, truncate)
    return m, texts, pairs, enc


def _usable_max_length(m: Model, max_length: int | None, paired: bool) -> int:
    """max_length validated for this model; None: the smaller of 256 and the positions it reads."""
    if max_length is None:
        max_length = fitting_max_length(m.max_positions)
    return validate_max_length(m.tokenizer, max_length, pair=paired, positions=m.max_positions, model=m.name)


def require_calls(m: Model, cap: LayerCapture) -> None:
    """A model whose attention bypasses transformers' attention registry leaves nothing to trace."""
    if not cap.calls:
        raise AttnscopeError(
            f"{m.architecture}'s attention does not go through transformers' attention registry, so attnscope "
            f"cannot capture it: use a model whose attention does (BERT, GPT-2, Llama, ...: see the README's families)"
        )


def _why_unverified(m: Model, requested: bool, params: list[AttentionParams] | None,
                    layers: dict[str, list[torch.Tensor]]) -> str | None:
    if not requested:
        return "traced with recompute=False"
    reason = families.why_unsupported(m.model)
    if reason is None and (params is None or "x" not in layers):
        reason = f"the attention input x of {m.architecture} was not captured"
    return reason


def per_layer(cap: LayerCapture) -> dict[str, list[torch.Tensor]]:
    """Captured stages of the padded batch: stage -> one [batch, ...] tensor per layer (no copies).

    scores (q k^T) are not here: the trace and the check each compute them from q and k when needed.
    """
    calls = cap.calls  # k and v stay one per k/v head (grouped-query attention)
    out = {s: [getattr(c, s) for c in calls] for s in ("q", "k", "v", "weights", "context")}
    for stage, ts in (("x", cap.x), ("output", cap.output)):
        if ts and len(ts) == len(calls):
            out[stage] = ts  # [batch, token, d_model] per layer
    return out


def model_outputs(m: Model, out: Any, n_layers: int) -> dict[str, list[torch.Tensor]]:
    """The model's own outputs per layer: output_attentions, and the attention input its hidden states imply."""
    ref: dict[str, list[torch.Tensor]] = {}
    if getattr(out, "attentions", None):
        ref["weights"] = list(out.attentions)  # [batch, head, query, key] per layer
    hidden = getattr(out, "hidden_states", None)
    if hidden and families.family_of(m.model) is not None and len(hidden) > n_layers:
        ref["x"] = [_x_from_hidden(m, i, h) for i, h in enumerate(hidden[:n_layers])]
    return ref


def _x_from_hidden(m: Model, layer: int, hidden: torch.Tensor) -> torch.Tensor:
    """The attention input the model's own hidden state implies: itself, or after a pre-attention norm."""
    norm = families.pre_attention(m.model, layer)
    if norm is None:
        return hidden
    with torch.no_grad():
        out: torch.Tensor = norm(hidden)
    return out


def model_info(m: Model, cap: LayerCapture, params: list[AttentionParams] | None) -> dict[str, Any]:
    rope = params[0].rope if params else None
    fam = families.family_of(m.model)
    first = cap.calls[0] if cap.calls else None
    info = describe_capture(m, first.q if first else None, first.k if first else None, cap.x[0] if cap.x else None,
                            len(cap.calls), families.is_causal(m.model, first.module if first else None))
    info.update(
        pre_norm=fam.pre_attention is not None if fam else None,  # a norm before the attention (else after it)
        rope=rope.kind if rope else None,  # the rotation's variant (default, linear, dynamic, llama3, yarn)
        d_rot=rope.d_rot if rope else None,  # how many dims of each head rotate (partial rotary: fewer than d_head)
    )
    return info


__all__ = ["ForwardPass", "Trace", "forward_pass", "trace"]
