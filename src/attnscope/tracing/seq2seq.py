"""Trace an encoder-decoder model (T5, BART, mBART, Marian) on a source and a target: its three kinds of attention.

The target is the decoder's input as in training (teacher forcing): tokenized as labels, then shifted one
token to the right behind the model's decoder start token, as `shift_tokens_right` /
`prepare_decoder_input_ids_from_labels` do. So the decoder's tokens are the start token and the target's
tokens but its last (usually the end-of-sequence token): query i is the step that predicts label i. Without a
target, the model generates one greedily (`model.generate`) and that is traced the same way (every step's
attention is a row of it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, overload

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from attnscope import families
from attnscope.capture import LayerCapture, capturing
from attnscope.errors import AttnscopeError, require_text
from attnscope.models import DeviceLike, DtypeLike, Model, ModelLike, describe_capture, load_model
from attnscope.placement import on_host
from attnscope.records.trace import EncoderDecoderTrace
from attnscope.tokens import Token, encode, fitting_max_length, piece_decoder, validate_max_length
from attnscope.tracing.seq2seq_rows import KindResult, kind_traces
from attnscope.verify.seq2seq import KindCapture, verify_kind

DEFAULT_NEW_TOKENS = 20  # a target generated when none is given: this many tokens at most, by default


@dataclass
class Targets:
    """The decoder's input of a padded batch: ids [batch, token], keep [batch, token], each row's tokens."""

    ids: torch.Tensor
    keep: torch.Tensor
    tokens: list[list[Token]]
    texts: list[str]
    truncated: list[bool]
    generated: bool


@overload
def trace_seq2seq(  # type: ignore[overload-overlap]
    source: str, target: str | None = ..., model: ModelLike = ..., max_length: int | None = ..., truncate: bool = ...,
    tokenizer: PreTrainedTokenizerBase | None = ..., recompute: bool = ..., device: DeviceLike = ...,
    dtype: DtypeLike = ..., max_new_tokens: int = ...,
) -> EncoderDecoderTrace: ...
@overload
def trace_seq2seq(
    source: Sequence[str], target: Sequence[str] | None = ..., model: ModelLike = ..., max_length: int | None = ...,
    truncate: bool = ..., tokenizer: PreTrainedTokenizerBase | None = ..., recompute: bool = ...,
    device: DeviceLike = ..., dtype: DtypeLike = ..., max_new_tokens: int = ...,
) -> list[EncoderDecoderTrace]: ...


def trace_seq2seq(
    source: str | Sequence[str],
    target: str | Sequence[str] | None = None,
    model: ModelLike = None,
    max_length: int | None = None,
    truncate: bool = True,
    tokenizer: PreTrainedTokenizerBase | None = None,
    recompute: bool = True,
    device: DeviceLike = None,
    dtype: DtypeLike = None,
    max_new_tokens: int = DEFAULT_NEW_TOKENS,
) -> EncoderDecoderTrace | list[EncoderDecoderTrace]:
    """Run an encoder-decoder model on a source and a target (teacher-forced) and trace its three kinds of
    attention: encoder self-attention, decoder causal self-attention, cross-attention (target -> source).

    A list of sources (and as many targets) is one padded batch. target=None: the model generates each target
    greedily, up to max_new_tokens, and the trace records it (EncoderDecoderTrace.generated). max_length
    counts the tokens of the source and of the target each, special tokens included. The rest as trace().
    """
    single = isinstance(source, str)
    sources = [source] if isinstance(source, str) else list(source)
    targets = _target_list(target, len(sources), single)
    if not sources:
        raise AttnscopeError("no source given: pass a sentence or a non-empty list of sentences", parameter="source")
    for s in sources:
        require_text(s, "source", parameter="source")
    m = load_model(model, tokenizer, device=device, dtype=dtype)
    validate_encoder_decoder(m)
    if max_length is None:  # the smaller of 256 and the positions the model reads, for the source and the target
        max_length = fitting_max_length(m.max_positions)
    max_length = validate_max_length(m.tokenizer, max_length, pair=None, positions=m.max_positions, model=m.name)
    src = encode(m.tokenizer, sources, None, max_length, truncate)
    if targets is None:
        dec = generated_targets(m, src.inputs, _validate_new_tokens(max_new_tokens, m))
    else:
        dec = teacher_forced(m, targets, max_length, truncate)
    traced = _traced(m, src.inputs["input_ids"], src.inputs["attention_mask"], dec, recompute)
    out = _records(traced, sources, src.tokens, src.truncated, dec)
    return out[0] if single else out


def trace_seq2seq_ids(m: Model, source_ids: torch.Tensor, decoder_ids: torch.Tensor, source_tokens: list[Token],
                      decoder_tokens: list[Token], source: str, target: str,
                      recompute: bool = True) -> EncoderDecoderTrace:
    """Trace one source and one decoder input given as ids, with no tokenizing and no shifting: the encoder reads
    source_ids [token], the decoder decoder_ids [token] as they are (its start token first, every token kept).
    The Tokens are the caller's for those ids (0-indexed on each side); source and target are the texts the record
    names. For a caller that already holds the ids (an attribution's objective), so the trace is of exactly them."""
    src = source_ids[None]  # [1, source token]
    dec = Targets(ids=decoder_ids[None], keep=torch.ones_like(decoder_ids[None]), tokens=[decoder_tokens],
                  texts=[target], truncated=[False], generated=False)
    traced = _traced(m, src, torch.ones_like(src), dec, recompute)
    return _records(traced, [source], [source_tokens], [False], dec)[0]


def _records(traced: list[KindResult], sources: list[str], source_tokens: list[list[Token]],
             source_truncated: list[bool], dec: Targets) -> list[EncoderDecoderTrace]:
    """One EncoderDecoderTrace per row of a traced batch (a generated target is recorded as generated)."""
    info = {k: v for k, v in traced[0].info.items() if k not in ("attention", "causal")}
    out = []
    for row, (s, t) in enumerate(zip(sources, dec.texts, strict=True)):
        encoder, decoder, cross = kind_traces(traced, row, source_tokens[row], dec.tokens[row], s, t,
                                              (source_truncated[row], dec.truncated[row]))
        out.append(EncoderDecoderTrace(model=info, source=s, target=None if dec.generated else t, encoder=encoder,
                                       decoder=decoder, cross=cross))
    return out


def _target_list(target: str | Sequence[str] | None, n: int, single: bool) -> list[str] | None:
    if target is None:
        return None
    targets = [target] if isinstance(target, str) else list(target)
    if single != isinstance(target, str) or len(targets) != n:
        raise AttnscopeError(f"give one target per source: {n} source(s), {len(targets)} target(s)",
                             parameter="target")
    for t in targets:
        require_text(t, "target", parameter="target")
    return targets


def validate_encoder_decoder(m: Model) -> None:
    """A one-line error unless m is an encoder-decoder model of a family attnscope knows."""
    if not families.is_encoder_decoder(m.model):
        raise AttnscopeError(f"{m.name} ({m.architecture}) is not an encoder-decoder model (T5, BART, mBART, "
                             "Marian): trace its one kind of attention with attnscope.trace(text)")
    fam = families.family_of(m.model)
    if fam is None or fam.cross is None:
        known = ", ".join(k for k, f in families.FAMILIES.items() if f.cross is not None)
        raise AttnscopeError(f"no attnscope adapter for the encoder-decoder model type "
                             f"{getattr(m.model.config, 'model_type', '?')!r} ({m.architecture}): use one of {known}")


def _validate_new_tokens(n: int, m: Model) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n < m.max_positions:
        raise AttnscopeError(f"max_new_tokens must be an integer from 1 to {m.max_positions - 1}, got {n!r}",
                             parameter="max_new_tokens")
    return n


def shift_right(m: Model, labels: torch.Tensor) -> torch.Tensor:
    """The decoder input for labels [batch, token]: the model's own prepare_decoder_input_ids_from_labels
    (BART, T5, Marian: the decoder start token, then the labels but the last; mBART: its last non-pad token,
    the language id, moved to the front), else the start token and the labels but the last."""
    prepare = getattr(m.model, "prepare_decoder_input_ids_from_labels", None)
    if callable(prepare):
        shifted: torch.Tensor = prepare(labels=labels)
        return shifted
    start = getattr(m.model.config, "decoder_start_token_id", None)
    if start is None:
        raise AttnscopeError(f"{m.name} names no decoder_start_token_id in its config: set it to trace a target")
    return torch.cat([torch.full_like(labels[:, :1], int(start)), labels[:, :-1]], dim=1)


def teacher_forced(m: Model, targets: list[str], max_length: int, truncate: bool) -> Targets:
    """The targets as labels, shifted right behind the decoder start token (what training feeds the decoder)."""
    labels = encode(m.tokenizer, targets, None, max_length, truncate, as_target=True)
    ids, keep = labels.inputs["input_ids"], labels.inputs["attention_mask"]
    shifted = shift_right(m, ids)  # [batch, token]
    shifted_keep = torch.cat([torch.ones_like(keep[:, :1]), keep[:, :-1]], dim=1)
    tokens = [[_special_token(m.tokenizer, int(shifted[row, 0]), 0),
               *(replace(t, index=t.index + 1) for t in toks[:-1])] for row, toks in enumerate(labels.tokens)]
    return Targets(shifted, shifted_keep, tokens, targets, labels.truncated, generated=False)


def generated_targets(m: Model, source: dict[str, torch.Tensor], max_new_tokens: int) -> Targets:
    """Greedy targets from model.generate; the decoder input is each sequence without its last token."""
    with torch.no_grad():
        seqs = m.model.generate(input_ids=source["input_ids"].to(m.device),  # type: ignore[operator]
                                attention_mask=source["attention_mask"].to(m.device), max_new_tokens=max_new_tokens,
                                do_sample=False, num_beams=1).cpu()
    eos = m.model.generation_config.eos_token_id
    ends = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
    rows = [_until_end(seq.tolist(), ends) for seq in seqs]
    width = max(len(r) - 1 for r in rows) or 1
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    keep = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        inputs = r[:-1] or r  # [start, t1 .. t(n-1)]: query j predicts t(j+1)
        ids[i, : len(inputs)], keep[i, : len(inputs)] = torch.tensor(inputs), 1
    tokens = [[_special_token(m.tokenizer, t, j) for j, t in enumerate(r[:-1] or r)] for r in rows]
    texts = [str(m.tokenizer.decode(r[1:], skip_special_tokens=True)) for r in rows]
    return Targets(ids, keep, tokens, texts, [False] * len(rows), generated=True)


def _until_end(seq: list[int], ends: set[int]) -> list[int]:
    """A generated sequence up to its first end-of-sequence token after the start (included)."""
    for i, t in enumerate(seq[1:], start=1):
        if t in ends:
            return seq[: i + 1]
    return seq


def _special_token(tok: PreTrainedTokenizerBase, token_id: int, index: int) -> Token:
    """A decoder token known by its id only (the start token, a generated token), with its decoded text as the
    tokenizer decodes the piece alone (tokens.piece_decoder), as every other Token has."""
    special = token_id in set(tok.all_special_ids)
    text = str(tok.convert_ids_to_tokens(token_id))
    decode = piece_decoder(tok)
    return Token(index=index, text=text, id=token_id, special=special, decoded=None if decode is None else decode(text))


def _traced(m: Model, input_ids: torch.Tensor, source_keep: torch.Tensor, dec: Targets,
            recompute: bool) -> list[KindResult]:
    """One forward pass, captured, split into the three kinds (encoder, decoder, cross), each checked."""
    kinds = families.seq2seq_modules(m.model)
    params = on_host(families.seq2seq_params(m.model)) if recompute else None
    with torch.no_grad(), capturing(m.model) as cap, _extra_hooks(kinds) as extra:
        out = m.model(input_ids=input_ids.to(m.device), attention_mask=source_keep.to(m.device),
                      decoder_input_ids=dec.ids.to(m.device), decoder_attention_mask=dec.keep.to(m.device),
                      output_attentions=recompute, output_hidden_states=recompute, use_cache=False)
    if not cap.calls:
        raise AttnscopeError(f"{m.architecture}'s attention does not go through transformers' attention registry")
    split = on_host(_by_kind(cap, kinds, extra))  # float32 on the CPU: the check recomputes in float32
    results = []
    for kind in ("encoder", "decoder", "cross"):
        keep = source_keep if kind == "encoder" else dec.keep
        kc = KindCapture(kind, split[kind], keep, source_keep if kind == "cross" else keep,
                         split["memory"] if kind == "cross" else None)
        check = verify_kind(kc, on_host(_reference(m, out, kind, len(kinds[kind]))), params[kind] if params else None) \
            if recompute else None
        results.append(KindResult(_info(m, kc), kc, check, params[kind] if params else None, split["scaling"][kind],
                                  None if recompute else "traced with recompute=False"))
    return results


def _info(m: Model, kc: KindCapture) -> dict[str, Any]:
    """The model's description, with the sizes and causality of one kind of attention."""
    q, k, x = kc.layers["q"][0], kc.layers["k"][0], kc.layers["x"][0]
    info = describe_capture(m, q, k, x, len(kc.layers["q"]), causal=kc.kind == "decoder")
    info.update(attention=kc.kind, heads=int(q.shape[1]), rope=None, d_rot=None)
    return info


@contextlib.contextmanager
def _extra_hooks(kinds: dict[str, list[nn.Module]]) -> Iterator[dict[str, list[torch.Tensor]]]:
    """What the registry call does not see: cross-attention's k/v input (the memory) and T5's position bias."""
    got: dict[str, list[torch.Tensor]] = {"memory": [], "position_bias": []}

    def memory_hook(_m: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        got["memory"].append(kwargs["key_value_states"].detach())  # [batch, key, d_model]

    def bias_hook(_m: nn.Module, _args: Any, output: Any) -> None:
        if isinstance(output, tuple) and len(output) == 3:  # T5Attention: (output, position_bias, weights)
            got["position_bias"].append(output[1].detach())  # [1, head, query, key]

    handles = [mod.register_forward_pre_hook(memory_hook, with_kwargs=True) for mod in kinds["cross"]]
    handles += [mod.register_forward_hook(bias_hook) for kind in ("encoder", "decoder") for mod in kinds[kind]]
    try:
        yield got
    finally:
        for h in handles:
            h.remove()


def _by_kind(cap: LayerCapture, kinds: dict[str, list[nn.Module]],
             extra: dict[str, list[torch.Tensor]]) -> dict[str, Any]:
    """The capture's calls (in call order) split by kind: stage -> one [batch, ...] tensor per layer."""
    kind_of = {id(mod): kind for kind, mods in kinds.items() for mod in mods}
    split: dict[str, Any] = {kind: {s: [] for s in ("x", "q", "k", "v", "weights", "context", "output")}
                             for kind in kinds}
    for i, call in enumerate(cap.calls):
        st = split[kind_of[id(call.module)]]
        for s in ("q", "k", "v", "weights", "context"):
            st[s].append(getattr(call, s))
        st["x"].append(cap.x[i])
        st["output"].append(cap.output[i])
    biases = iter(extra["position_bias"])
    if extra["position_bias"]:  # in call order: encoder layers, then the decoder's self-attention layers
        for kind in ("encoder", "decoder"):
            rows = int(split[kind]["q"][0].shape[0])
            split[kind]["position_bias"] = [next(biases).expand(rows, -1, -1, -1) for _ in kinds[kind]]
    split["memory"] = extra["memory"]
    split["scaling"] = {kind: [c.scaling for c in cap.calls if kind_of[id(c.module)] == kind] for kind in kinds}
    return split


def _reference(m: Model, out: Any, kind: str, n_layers: int) -> dict[str, list[torch.Tensor]]:
    """The model's own outputs for one kind: its attentions, the x its hidden states imply, the encoder output."""
    attentions = {"encoder": out.encoder_attentions, "decoder": out.decoder_attentions,
                  "cross": out.cross_attentions}[kind]
    ref: dict[str, list[torch.Tensor]] = {"weights": list(attentions)} if attentions else {}
    hidden = out.encoder_hidden_states if kind == "encoder" else out.decoder_hidden_states
    if kind != "cross" and hidden and len(hidden) > n_layers:
        ref["x"] = [_x_from_hidden(m, kind, layer, h) for layer, h in enumerate(hidden[:n_layers])]
    if kind == "cross":
        ref["memory"] = [out.encoder_last_hidden_state]
    return ref


def _x_from_hidden(m: Model, kind: str, layer: int, hidden: torch.Tensor) -> torch.Tensor:
    norm: Callable[[torch.Tensor], torch.Tensor] | None = families.pre_attention(m.model, layer, stack=kind)
    return hidden if norm is None else norm(hidden)


__all__ = ["DEFAULT_NEW_TOKENS", "trace_seq2seq", "trace_seq2seq_ids", "validate_encoder_decoder"]
