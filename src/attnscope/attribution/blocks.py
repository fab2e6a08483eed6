"""What the decomposition methods read from one real forward pass: each layer's attention block, captured.

Every layer's attention output is a sum of one vector per head h and key j (Kobayashi et al. 2020):

    output_i = sum_h sum_j alpha^h_ij f^h(x_j) + b_O,   f^h(x_j) = v^h_j W_O^h

where v^h_j is the captured `v` stage (b_V included; grouped k/v heads repeated for the query heads they
serve) and W_O^h head h's d_head rows of the output projection. The residual stream and the block's output
come from hooks on the real modules (named by each family's BlockNorms in families.adapters); nothing is
recomputed from the model's code.

Two block shapes are decomposed (ALTI needs the whole block; norm-based attention only the sum above):
- post-norm (BERT, RoBERTa, ELECTRA, DistilBERT): block output = LayerNorm(x + output), x the attention input;
- pre-norm (GPT-2, Llama, Mistral, Qwen2, Qwen3, Phi-3): block output = x + output, with the attention
  reading norm(x); the block output is what enters the layer's second norm (ln_2, post_attention_layernorm);
- sandwich (Gemma 2, Gemma 3): block output = x + RMSNorm(output), the attention reading norm(x); the block
  output is what enters pre_feedforward_layernorm.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import torch
from torch import nn

from attnscope.capture import AttentionCall, hooked
from attnscope.errors import AttnscopeError
from attnscope.families import (
    base_of,
    family_of,
    has_attention_modules,
    is_encoder_decoder,
    layer_modules,
    pre_attention,
)
from attnscope.families.adapters import FAMILIES, BlockNorms, module_name, submodule
from attnscope.maths import expand_kv
from attnscope.models import Model
from attnscope.norms import head_vectors

T = TypeVar("T")
BLOCK_FAMILIES = tuple(sorted(name for name, fam in FAMILIES.items() if fam.block_norms is not None))
LAYER_ALONE = {"value_zeroing"}  # methods that call each layer module alone (not one shared module: ALBERT)


@dataclass(frozen=True)
class Norm:
    """A norm inside the block: its parameters and what it received and returned (float64). A post-norm
    LayerNorm of x + output (centred), or a sandwich RMSNorm of the output alone before the residual sum."""

    gamma: torch.Tensor  # [d_model]: what the normalised vector is multiplied by (1 + w for Gemma's RMSNorm)
    beta: torch.Tensor  # [d_model] (zeros for RMSNorm)
    eps: float
    received: torch.Tensor  # [token, d_model]: as the real module received it
    returned: torch.Tensor  # [token, d_model]
    centred: bool = True  # LayerNorm subtracts the mean; RMSNorm does not
    sandwich: bool = False  # the norm takes the attention output alone, the residual is added after it


@dataclass(frozen=True)
class LayerBlock:
    """One layer's attention block of one text, in float64 or float32 (captured in the model's dtype)."""

    weights: torch.Tensor  # [head, query, key]
    v: torch.Tensor  # [head, key, d_head]: the captured v stage, k/v heads repeated for their query heads
    w_o: torch.Tensor  # [head * d_head, d_model]
    b_o: torch.Tensor  # [d_model] (zeros for projections without a bias)
    output: torch.Tensor  # [token, d_model]: the output projection's result, captured
    residual: torch.Tensor | None = None  # [token, d_model]: the stream the block adds to (ALTI only)
    block_output: torch.Tensor | None = None  # [token, d_model]: captured (ALTI only)
    norm: Norm | None = None  # post-norm blocks (ALTI only)

    @property
    def f(self) -> torch.Tensor:
        """f^h(x_j) = v^h_j W_O^h: [head, key, d_model] (attnscope.norms.head_vectors)."""
        return head_vectors(self.v, self.w_o)  # [head, key, d_head] @ [head, d_head, d_model]

    def attention_sum(self) -> torch.Tensor:
        """sum_j sum_h alpha^h_ij f^h(x_j) = merged(alpha v) W_O, the heads' contexts projected: [query, d_model].

        The same sum as attention_vectors().sum(1), by the associativity of alpha v W_O: h n^2 d_head + n d^2
        multiplications instead of h n^2 d_model, and no [query, key, d_model] tensor."""
        return merged_context(self.weights, self.v) @ self.w_o  # [query, head * d_head] @ [head * d_head, d_model]

    def attention_vectors(self) -> torch.Tensor:
        """sum_h alpha^h_ij f^h(x_j): [query, key, d_model]."""
        return torch.einsum("hqk,hkd->qkd", self.weights, self.f)


def merged_context(weights: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The heads' contexts alpha v side by side: weights [head, query, key], v [head, key, d_head] ->
    [query, head * d_head] (head h in columns h * d_head.., the rows of W_O it meets)."""
    context = weights @ v  # [head, query, key] @ [head, key, d_head] -> [head, query, d_head]
    return context.transpose(0, 1).reshape(weights.shape[1], -1)  # [query, head * d_head]


@dataclass
class _Kept:
    """What capture_blocks keeps of each layer: the attention weights and v of each call, the attention input x and
    the output projection's result. Not capture.LayerCapture, which keeps every call whole: q, k and the context
    (read by no decomposition) would stay alive through the forward pass, each layer's memory fresh pages (MiniLM,
    128 tokens: the recording costs 0.07 of a forward kept whole, 0.04 kept so)."""

    weights: list[torch.Tensor] = field(default_factory=list)  # [batch, head, query, key]
    v: list[torch.Tensor] = field(default_factory=list)  # [batch, kv_head, key, d_head]
    x: list[torch.Tensor] = field(default_factory=list)  # [batch, token, d_model]
    output: list[torch.Tensor] = field(default_factory=list)  # [batch, token, d_model]

    def on_attention(self, call: AttentionCall) -> None:
        self.weights.append(call.weights)
        self.v.append(call.v)

    def drop(self, layer: int) -> None:
        """Let go of one layer's pieces (map_blocks has given them to its function)."""
        for kept in (self.weights, self.v, self.x, self.output):
            kept[layer] = _GONE


@dataclass
class _Extra:
    """Hooked tensors besides capture's own, one entry per layer: [batch, token, d_model] each."""

    residual: list[torch.Tensor] = field(default_factory=list)
    block_output: list[torch.Tensor] = field(default_factory=list)
    norm_in: list[torch.Tensor] = field(default_factory=list)
    norm_out: list[torch.Tensor] = field(default_factory=list)

    def drop(self, layer: int) -> None:
        for kept in (self.residual, self.block_output, self.norm_in, self.norm_out):
            if layer < len(kept):  # the lists whole_block fills
                kept[layer] = _GONE


_GONE = torch.empty(0)  # in place of a layer's piece once let go


def refuse_unsupported(m: Model, method: str, whole_block: bool) -> None:
    """One-line AttnscopeError where the method cannot decompose this model's attention."""
    fam = family_of(m.model)
    kind = str(getattr(m.model.config, "model_type", "?"))
    if is_encoder_decoder(m.model):
        raise AttnscopeError(f"{method} does not support encoder-decoder models ({kind}): use a decoder-only or "
                             "encoder-only model", parameter="methods")
    if fam is None or not has_attention_modules(m.model):
        raise AttnscopeError(f"{method} needs a model family attnscope has an adapter for; {kind!r} has none",
                             parameter="methods")
    if method in LAYER_ALONE and fam.shared_layers:
        raise AttnscopeError(f"{method} calls each layer alone, and {fam.name} runs one shared module for every "
                             "layer: choose another method (norm applies)", parameter="methods")
    if whole_block and fam.block_norms is None:
        raise AttnscopeError(f"{method} decomposes the whole attention block of {', '.join(BLOCK_FAMILIES)} "
                             f"models only; {kind!r} places its norms otherwise", parameter="methods")


def one_text(inputs: dict[str, torch.Tensor], method: str) -> int:
    """The token count of a batch of one unpadded text; a one-line error otherwise."""
    ids = inputs["input_ids"]
    if ids.ndim != 2 or ids.shape[0] != 1:
        raise AttnscopeError(f"{method} explains one text at a time: got a batch of shape {list(ids.shape)}")
    mask = inputs.get("attention_mask")
    if mask is not None and not bool(mask.all()):
        raise AttnscopeError(f"{method} explains one unpadded text: the attention mask hides some tokens")
    return int(ids.shape[1])


def capture_blocks(m: Model, inputs: dict[str, torch.Tensor], whole_block: bool,
                   dtype: torch.dtype = torch.float64) -> list[LayerBlock]:
    """Run the model once on one text, up to the last layer's attention block, and return each layer's block
    (whole_block: with residual, block output and norm, for ALTI), its tensors in dtype (float64 to read and
    recompute; the methods take float32, the captured pieces' own precision, where float64's small batched
    products cost several times more)."""
    return map_blocks(m, inputs, whole_block, lambda block: block, dtype)


@torch.no_grad()
def map_blocks(m: Model, inputs: dict[str, torch.Tensor], whole_block: bool, fn: Callable[[LayerBlock], T],
               dtype: torch.dtype = torch.float64) -> list[T]:
    """fn of each layer's block (as capture_blocks gives it), called inside the forward pass as soon as the layer's
    block is captured, in layer order; the captured pieces are let go once fn returns. A method that keeps only
    fn's result holds one layer's pieces at a time: the forward pass reuses their memory, where kept whole the
    pieces of every layer take fresh pages (MiniLM at 128 tokens: ~1,000 page faults a call, each several
    microseconds on a virtual machine)."""
    cap, extra = _Kept(), _Extra()
    mods = layer_modules(m.model)  # found once: each search walks every module of the model
    unique = list(dict.fromkeys(mods))  # the attention modules, each once (ALBERT: one for every layer)
    lns = _post_norms(m.model, mods, _norms_of(m)) if whole_block and _norms_of(m).kind == "post" else None
    fam = family_of(m.model)
    assert fam is not None
    results: list[T] = []

    def emit(*_hook_args: Any) -> None:  # the next layer's block, complete (a forward hook on _each_layer's modules)
        layer = len(results)
        weights, kv, mod = cap.weights[layer], cap.v[layer], mods[layer]
        p = fam.params(m.model, mod, layer)
        heads = weights.shape[1]
        v = expand_kv(kv[0].to(dtype), heads // kv.shape[1])  # [head, key, d_head]
        w_o = p.w_o.to(dtype)  # [head * d_head, d_model]
        b_o = p.b_o.to(dtype) if p.b_o is not None else torch.zeros(w_o.shape[-1], dtype=dtype)
        block = LayerBlock(weights[0].to(dtype), v, w_o, b_o, cap.output[layer][0].to(dtype))
        ln = lns[layer] if lns is not None else None
        results.append(fn(_whole(m, block, layer, ln, cap, extra, dtype) if whole_block else block))
        cap.drop(layer)
        extra.drop(layer)
        if len(results) == len(mods):
            raise _Enough  # the rest of the forward pass is not read

    with (contextlib.suppress(_Enough), hooked(m.model, cap, cap.x.append, cap.output.append, unique),
          _extra_hooks(m, extra, whole_block, lns, len(unique)),
          _each_layer(m, mods, lns, whole_block, emit)):
        m.base(**inputs)  # the transformer alone: the decomposition needs no logits (an LM head costs a layer or more)
    return results


def _norms_of(m: Model) -> BlockNorms:
    fam = family_of(m.model)
    assert fam is not None and fam.block_norms is not None  # refuse_unsupported said so before
    return fam.block_norms


def _whole(m: Model, block: LayerBlock, layer: int, ln: nn.LayerNorm | None, cap: _Kept, extra: _Extra,
           dtype: torch.dtype) -> LayerBlock:
    """The block with its residual stream, its captured output and (post-norm: ln, sandwich) its norm."""
    where = _norms_of(m)
    if ln is not None:  # post-norm: the residual is the attention input itself
        norm = Norm(ln.weight.detach().to(dtype), ln.bias.detach().to(dtype), float(ln.eps),
                    extra.norm_in[layer][0].to(dtype), extra.norm_out[layer][0].to(dtype))
        return replace(block, residual=cap.x[layer][0].to(dtype), block_output=norm.returned, norm=norm)
    residual, output = extra.residual[layer][0].to(dtype), extra.block_output[layer][0].to(dtype)
    if where.kind == "sandwich":
        assert where.attention_norm is not None
        rms: Any = submodule(base_of(m.model), where.attention_norm.format(layer=layer))
        gamma = rms.weight.detach().to(dtype) + (1.0 if where.unit_offset else 0.0)  # Gemma's RMSNorm: 1 + w
        norm = Norm(gamma, torch.zeros_like(gamma), float(rms.eps), extra.norm_in[layer][0].to(dtype),
                    extra.norm_out[layer][0].to(dtype), centred=False, sandwich=True)
        return replace(block, residual=residual, block_output=output, norm=norm)
    return replace(block, residual=residual, block_output=output)


@contextlib.contextmanager
def _extra_hooks(m: Model, extra: _Extra, whole_block: bool, lns: list[nn.LayerNorm] | None,
                 layers: int) -> Iterator[None]:
    handles: list[Any] = []
    if whole_block:
        where = _norms_of(m)
        if lns is not None:
            for ln in dict.fromkeys(lns):  # each module once
                handles.append(ln.register_forward_hook(_take_both(extra)))
        else:
            base = base_of(m.model)
            for layer in range(layers):
                before = pre_attention(m.model, layer)
                assert before is not None and where.block_output is not None
                handles.append(before.register_forward_pre_hook(_take_input(extra.residual)))
                after = submodule(base, where.block_output.format(layer=layer))
                handles.append(after.register_forward_pre_hook(_take_input(extra.block_output)))
                if where.attention_norm is not None:
                    rms = submodule(base, where.attention_norm.format(layer=layer))
                    handles.append(rms.register_forward_hook(_take_both(extra)))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


class _Enough(Exception):
    """Raised by a hook once every layer's block is captured: the rest of the forward pass is not read."""


@contextlib.contextmanager
def _each_layer(m: Model, mods: list[nn.Module], lns: list[nn.LayerNorm] | None, whole_block: bool,
                emit: Callable[..., None]) -> Iterator[None]:
    """emit() each time a layer's block is complete; emit ends the forward pass (raises _Enough) once the last one
    is: the last layer's MLP and the final norm compute nothing the decomposition reads (MiniLM: a tenth of its
    forward at 128 tokens). A hook registered after the capturing ones on the module that captures last in each
    layer (the output projection, the post-norm LayerNorm or what takes the block output); ALBERT's one shared
    module calls it once per layer."""
    modules: list[nn.Module]
    if not whole_block:  # the output projection's result is the last piece norm-based attention reads
        fam = family_of(m.model)
        assert fam is not None
        modules, pre = [fam.out_proj(m.model, mod) for mod in mods], False
    elif lns is not None:
        modules, pre = list(lns), False
    else:
        where = _norms_of(m).block_output
        assert where is not None
        modules = [submodule(base_of(m.model), where.format(layer=layer)) for layer in range(len(mods))]
        pre = True
    handles = [mod.register_forward_pre_hook(emit) if pre else mod.register_forward_hook(emit)
               for mod in dict.fromkeys(modules)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _post_norms(model: nn.Module, mods: list[nn.Module], where: BlockNorms) -> list[nn.LayerNorm]:
    """Each layer's post-norm LayerNorm, found from its attention module (BERT's <layer>.attention.self ->
    <layer>.attention.output.LayerNorm; DistilBERT's <layer>.attention -> <layer>.sa_layer_norm), named by the
    adapters' per-model cache (module_name)."""
    assert where.post_norm is not None
    lns = []
    for attention in mods:
        name = module_name(model, attention)
        parent = name.rsplit(".", 1)[0] if "." in name else ""
        ln = submodule(model, f"{parent}.{where.post_norm}" if parent else where.post_norm)
        assert isinstance(ln, nn.LayerNorm)
        lns.append(ln)
    return lns


def _take_input(into: list[torch.Tensor]) -> Any:
    return lambda _mod, args: into.append(args[0].detach())


def _take_both(extra: _Extra) -> Any:
    def hook(_mod: nn.Module, args: tuple[torch.Tensor, ...], out: torch.Tensor) -> None:
        extra.norm_in.append(args[0].detach())
        extra.norm_out.append(out.detach())

    return hook


__all__ = ["BLOCK_FAMILIES", "LayerBlock", "Norm", "capture_blocks", "map_blocks", "merged_context", "one_text",
           "refuse_unsupported"]
