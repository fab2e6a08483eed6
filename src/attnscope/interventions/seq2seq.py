"""Head gates on encoder-decoder models (T5, BART, mBART, Marian): a forward makes three kinds of attention call,
encoder self-attention, decoder self-attention and cross-attention, and a gate is addressed as (kind, layer, head).

The edit learns the kind of each call from the attention module capture hands it (families.seq2seq_modules);
within a kind the calls come in layer order, so each kind's HeadEdit numbers its own stack. The effect read is
the teacher-forced target's log-probability (sum over target tokens) and the loss (mean over target tokens),
the target shifted into the decoder's input as seq2seq.teacher_forced does for a trace.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from attnscope import families
from attnscope.errors import AttnscopeError, require_text, validate_index
from attnscope.interventions.gates import Head, HeadEdit
from attnscope.models import Model
from attnscope.numbers import is_count
from attnscope.tokens import Token, encode

KINDS = ("encoder", "decoder", "cross")
KindHead = tuple[str, int, int]  # (kind, layer, head), layer and head 0-indexed
AnyHead = Head | KindHead


class KindEdit:
    """One HeadEdit per kind of attention call (a capture.Intervention for an encoder-decoder's forward)."""

    def __init__(self, model: nn.Module, edits: dict[str, HeadEdit]) -> None:
        self.edits = edits
        self._kind_of = {id(mod): kind for kind, mods in families.seq2seq_modules(model).items() for mod in mods}
        self._current: HeadEdit | None = None

    def reset(self) -> None:
        for edit in self.edits.values():
            edit._calls = 0

    def edit_mask(self, mask: torch.Tensor | None, query: torch.Tensor,
                  module: nn.Module | None = None) -> torch.Tensor | None:
        self._current = self.edits[self._kind_of[id(module)]]
        return self._current.edit_mask(mask, query)

    def edit_context(self, context: torch.Tensor) -> torch.Tensor:
        assert self._current is not None  # capture calls edit_mask first
        return self._current.edit_context(context)


def layout(m: Model) -> dict[str, tuple[int, int]]:
    """Each kind's (layers, heads per layer)."""
    return {kind: (len(mods), int(params[0].n_heads)) for (kind, mods), params in
            zip(families.seq2seq_modules(m.model).items(), families.seq2seq_params(m.model).values(), strict=True)}


def parse_kind_heads(spec: str, what: str = "heads") -> list[AnyHead]:
    """"cross:1.2,encoder:0.3" -> [("cross", 1, 2), ("encoder", 0, 3)]; a plain "3.1" stays (3, 1)."""
    heads: list[AnyHead] = []
    for item in (s.strip() for s in spec.split(",")):
        kind, _, pair = item.rpartition(":")
        parts = pair.split(".")
        if len(parts) != 2 or not all(is_count(p) for p in parts):
            raise AttnscopeError(f"{what} {item!r} is not layer.head: write heads like 3.1,0.7 (0-indexed), or "
                                 "kind:layer.head (cross:1.2) for an encoder-decoder")
        heads.append((kind, int(parts[0]), int(parts[1])) if kind else (int(parts[0]), int(parts[1])))
    return heads


def validate_kind_heads(m: Model, heads: Sequence[Any]) -> list[KindHead]:
    """Each head as (kind, layer, head), the kind known and layer and head in its range."""
    sizes = layout(m)
    out: list[KindHead] = []
    for h in heads:
        if len(h) != 3 or h[0] not in KINDS:
            raise AttnscopeError(f"head {_name(h)} names no kind of attention: {m.name} is an encoder-decoder, "
                                 f"write each head as kind:layer.head with kind one of {', '.join(KINDS)}")
        kind, layer, head = h
        validate_index(f"{kind} layer", layer, sizes[kind][0], m.name)
        validate_index(f"{kind} head", head, sizes[kind][1], m.name)
        out.append((str(kind), int(layer), int(head)))
    return out


def _name(h: Sequence[Any]) -> str:
    return ":".join(map(str, h[:-2])) + (":" if len(h) > 2 else "") + ".".join(map(str, h[-2:]))


def validate_attention(attention: str | None) -> str:
    if attention not in KINDS:
        raise AttnscopeError(f"attention {attention!r} is not a kind of attention of an encoder-decoder: "
                             f"choose attention among {', '.join(KINDS)} for the layer x head grid",
                             parameter="attention")
    return attention


def kind_gates(m: Model, chosen: list[KindHead], grid: str | None) -> dict[str, torch.Tensor]:
    """Gates per kind [layer, row, head]: row 0 open, row 1 the chosen heads closed (if any), then with a grid
    kind one row per head of that kind closed."""
    sizes = layout(m)
    first = 2 if chosen else 1
    n_rows = first + (sizes[grid][0] * sizes[grid][1] if grid is not None else 0)
    scale = {kind: torch.ones(n_layers, n_rows, n_heads) for kind, (n_layers, n_heads) in sizes.items()}
    for kind, layer, head in chosen:
        scale[kind][layer, 1, head] = 0.0
    if grid is not None:
        n_heads = sizes[grid][1]
        every = torch.arange(sizes[grid][0] * n_heads)
        scale[grid][every // n_heads, first + every, every % n_heads] = 0.0
    return scale


def kind_edit(m: Model, scale: dict[str, torch.Tensor],
              sources: dict[str, list[torch.Tensor | None]] | None = None) -> KindEdit:
    """Each kind's gates [layer, row, head], and what its closed gates let in (None: zeros)."""
    return KindEdit(m.model, {kind: HeadEdit(int(s.shape[0]), s, sources[kind] if sources else None)
                              for kind, s in scale.items()})


def kind_means(m: Model, inputs: dict[str, torch.Tensor]) -> dict[str, list[torch.Tensor | None]]:
    """Each kind's per-layer context of an untouched forward, averaged over its real query tokens (the source's
    for the encoder, the target's for decoder and cross): [1, head, 1, d_head] per layer."""
    from attnscope.capture import capturing

    kind_of = {id(mod): kind for kind, mods in families.seq2seq_modules(m.model).items() for mod in mods}
    target_keep = torch.ones_like(inputs["decoder_input_ids"])
    keep = {"encoder": inputs["attention_mask"], "decoder": target_keep, "cross": target_keep}
    out: dict[str, list[torch.Tensor | None]] = {kind: [] for kind in KINDS}
    with torch.no_grad(), capturing(m.model) as cap:
        m.model(**inputs)
    for call in cap.calls:
        kind = kind_of[id(call.module)]
        w = keep[kind].to(call.context.dtype)[:, None, :, None]  # [batch, 1, query, 1]
        out[kind].append((call.context * w).sum(dim=(0, 2), keepdim=True) / w.sum())  # [1, head, 1, d_head]
    return out


def seq2seq_inputs(m: Model, source: str, target: str | None,
                   max_length: int) -> tuple[dict[str, torch.Tensor], list[Token], list[int]]:
    """The source [1, token] and the teacher-forced decoder input [1, target]: inputs, source tokens, labels."""
    from attnscope.tracing.seq2seq import shift_right, validate_encoder_decoder

    validate_encoder_decoder(m)
    if target is None:
        raise AttnscopeError(f"{m.name} is an encoder-decoder: give target= (--target TEXT), the target text whose "
                             "teacher-forced log-probability is measured")
    require_text(target, "target", parameter="target")
    src = encode(m.tokenizer, [source], max_length=max_length, truncate=False)
    labels = encode(m.tokenizer, [target], None, max_length, False, as_target=True).inputs["input_ids"]  # [1, target]
    inputs = {"input_ids": src.inputs["input_ids"], "attention_mask": src.inputs["attention_mask"],
              "decoder_input_ids": shift_right(m, labels)}
    return inputs, src.tokens[0], [int(i) for i in labels[0]]


def seq2seq_measures(m: Model, inputs: dict[str, torch.Tensor], labels: list[int],
                     edit: KindEdit) -> dict[str, torch.Tensor]:  # inputs [rows, token], labels [target]
    """Per row: the target's log-probability (sum over its tokens) and the loss (mean NLL over them)."""
    from attnscope.capture import intervening

    edit.reset()
    with intervening(m.model, edit):
        logits = m.model(**inputs).logits  # [rows, target, vocab]
    idx = torch.tensor(labels)[None, :, None].expand(logits.shape[0], -1, 1)
    picked = logits.float().log_softmax(-1).gather(-1, idx)[..., 0]  # [rows, target]
    return {"target_logprob": picked.sum(-1), "loss": -picked.mean(-1)}
