"""What the decomposition methods read from one real forward pass: each layer's attention block, captured.

Every layer's attention output is a sum of one vector per head h and key j (Kobayashi et al. 2020):

    output_i = sum_h sum_j alpha^h_ij f^h(x_j) + b_O,   f^h(x_j) = v^h_j W_O^h

where v^h_j is the captured `v` stage (b_V included; grouped k/v heads repeated for the query heads they
serve) and W_O^h head h's d_head rows of the output projection. The residual stream and the block's output
come from hooks on the real modules (named below); nothing is recomputed from the model's code.

Two block shapes are decomposed (ALTI needs the whole block; norm-based attention only the sum above):
- post-norm (BERT, RoBERTa, ELECTRA, DistilBERT): block output = LayerNorm(x + output), x the attention input;
- pre-norm (GPT-2, Llama, Mistral, Qwen2, Qwen3, Phi-3): block output = x + output, with the attention
  reading norm(x); the block output is what enters the layer's second norm (ln_2, post_attention_layernorm);
- sandwich (Gemma 2, Gemma 3): block output = x + RMSNorm(output), the attention reading norm(x); the block
  output is what enters pre_feedforward_layernorm.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn

from attnscope.capture import LayerCapture, hooked
from attnscope.errors import AttnscopeError
from attnscope.families import attention_modules, base_of, family_of, is_encoder_decoder, layer_modules, pre_attention
from attnscope.maths import expand_kv
from attnscope.models import Model

POST_NORM = {  # the LayerNorm after the residual sum, relative to the attention module's parent
    **{name: "output.LayerNorm" for name in ("bert", "roberta", "electra")},  # <layer>.attention.output.LayerNorm
    "distilbert": "sa_layer_norm",  # <layer>.sa_layer_norm beside <layer>.attention
}
PRE_NORM_OUT = {  # the module whose input is the block output x + attention output (relative to the base model)
    "gpt2": "h.{layer}.ln_2",
    **{name: "layers.{layer}.post_attention_layernorm" for name in ("llama", "mistral", "qwen2", "qwen3", "phi3")},
}
SANDWICH = {  # RMSNorm (scaling by 1 + w) on the attention output before the residual sum; then the block output
    name: ("layers.{layer}.post_attention_layernorm", "layers.{layer}.pre_feedforward_layernorm")
    for name in ("gemma2", "gemma3_text")
}
BLOCK_FAMILIES = tuple(sorted(set(POST_NORM) | set(PRE_NORM_OUT) | set(SANDWICH)))
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
    """One layer's attention block of one text, in float64 (captured in the model's dtype)."""

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
        """f^h(x_j) = v^h_j W_O^h: [head, key, d_model]."""
        heads, _, d_head = self.v.shape
        return self.v @ self.w_o.reshape(heads, d_head, -1)  # [head, key, d_head] @ [head, d_head, d_model]

    def attention_sum(self) -> torch.Tensor:
        """sum_j sum_h alpha^h_ij f^h(x_j), without the [query, key, d_model] tensor: [query, d_model]."""
        return torch.einsum("hqk,hkd->qd", self.weights, self.f)

    def attention_vectors(self) -> torch.Tensor:
        """sum_h alpha^h_ij f^h(x_j): [query, key, d_model]."""
        return torch.einsum("hqk,hkd->qkd", self.weights, self.f)


@dataclass
class _Extra:
    """Hooked tensors besides capture's own, one entry per layer: [batch, token, d_model] each."""

    residual: list[torch.Tensor] = field(default_factory=list)
    block_output: list[torch.Tensor] = field(default_factory=list)
    norm_in: list[torch.Tensor] = field(default_factory=list)
    norm_out: list[torch.Tensor] = field(default_factory=list)


def refuse_unsupported(m: Model, method: str, whole_block: bool) -> None:
    """One-line AttnscopeError where the method cannot decompose this model's attention."""
    fam = family_of(m.model)
    kind = str(getattr(m.model.config, "model_type", "?"))
    if is_encoder_decoder(m.model):
        raise AttnscopeError(f"{method} does not support encoder-decoder models ({kind}): use a decoder-only or "
                             "encoder-only model", parameter="methods")
    if fam is None or not attention_modules(m.model):
        raise AttnscopeError(f"{method} needs a model family attnscope has an adapter for; {kind!r} has none",
                             parameter="methods")
    if method in LAYER_ALONE and fam.shared_layers:
        raise AttnscopeError(f"{method} calls each layer alone, and {fam.name} runs one shared module for every "
                             "layer: choose another method (norm applies)", parameter="methods")
    if whole_block and fam.name not in BLOCK_FAMILIES:
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


@torch.no_grad()
def capture_blocks(m: Model, inputs: dict[str, torch.Tensor], whole_block: bool) -> list[LayerBlock]:
    """Run the model once on one text and return each layer's block (whole_block: with residual, block output
    and norm, for ALTI)."""
    cap, extra = LayerCapture(), _Extra()
    with hooked(m.model, cap, cap.x.append, cap.output.append), _extra_hooks(m, extra, whole_block):
        m.model(**inputs)
    fam = family_of(m.model)
    assert fam is not None
    blocks = []
    for layer, (call, mod) in enumerate(zip(cap.calls, layer_modules(m.model), strict=True)):
        p = fam.params(m.model, mod, layer)
        heads = call.weights.shape[1]
        v = expand_kv(call.v[0].double(), heads // call.v.shape[1])  # [head, key, d_head]
        w_o = p.w_o.double()  # [head * d_head, d_model]
        b_o = p.b_o.double() if p.b_o is not None else torch.zeros(w_o.shape[-1], dtype=torch.float64)
        block = LayerBlock(call.weights[0].double(), v, w_o, b_o, cap.output[layer][0].double())
        blocks.append(_whole(m, block, layer, cap, extra) if whole_block else block)
    return blocks


def _whole(m: Model, block: LayerBlock, layer: int, cap: LayerCapture, extra: _Extra) -> LayerBlock:
    """The block with its residual stream, its captured output and (post-norm, sandwich) its norm."""
    fam = family_of(m.model)
    assert fam is not None
    if fam.name in POST_NORM:  # the residual is the attention input itself
        ln = _post_norm(m.model, attention_modules(m.model)[layer])
        norm = Norm(ln.weight.detach().double(), ln.bias.detach().double(), float(ln.eps),
                    extra.norm_in[layer][0].double(), extra.norm_out[layer][0].double())
        return replace(block, residual=cap.x[layer][0].double(), block_output=norm.returned, norm=norm)
    residual, output = extra.residual[layer][0].double(), extra.block_output[layer][0].double()
    if fam.name in SANDWICH:
        rms: Any = base_of(m.model).get_submodule(SANDWICH[fam.name][0].format(layer=layer))
        gamma = 1.0 + rms.weight.detach().double()  # Gemma's RMSNorm scales by 1 + w
        norm = Norm(gamma, torch.zeros_like(gamma), float(rms.eps), extra.norm_in[layer][0].double(),
                    extra.norm_out[layer][0].double(), centred=False, sandwich=True)
        return replace(block, residual=residual, block_output=output, norm=norm)
    return replace(block, residual=residual, block_output=output)


@contextlib.contextmanager
def _extra_hooks(m: Model, extra: _Extra, whole_block: bool) -> Iterator[None]:
    handles: list[Any] = []
    fam = family_of(m.model)
    if whole_block and fam is not None:
        if fam.name in POST_NORM:
            for mod in attention_modules(m.model):
                handles.append(_post_norm(m.model, mod).register_forward_hook(_take_both(extra)))
        else:
            base = base_of(m.model)
            for layer in range(len(attention_modules(m.model))):
                before = pre_attention(m.model, layer)
                assert before is not None
                handles.append(before.register_forward_pre_hook(_take_input(extra.residual)))
                out = SANDWICH[fam.name][1] if fam.name in SANDWICH else PRE_NORM_OUT[fam.name]
                after = base.get_submodule(out.format(layer=layer))
                handles.append(after.register_forward_pre_hook(_take_input(extra.block_output)))
                if fam.name in SANDWICH:
                    rms = base.get_submodule(SANDWICH[fam.name][0].format(layer=layer))
                    handles.append(rms.register_forward_hook(_take_both(extra)))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _post_norm(model: nn.Module, attention: nn.Module) -> nn.LayerNorm:
    """The post-norm block's LayerNorm, found from the attention module (BERT's <layer>.attention.self ->
    <layer>.attention.output.LayerNorm; DistilBERT's <layer>.attention -> <layer>.sa_layer_norm)."""
    fam = family_of(model)
    assert fam is not None
    name = next(n for n, mod in model.named_modules() if mod is attention)
    parent = name.rsplit(".", 1)[0] if "." in name else ""
    ln = model.get_submodule(f"{parent}.{POST_NORM[fam.name]}" if parent else POST_NORM[fam.name])
    assert isinstance(ln, nn.LayerNorm)
    return ln


def _take_input(into: list[torch.Tensor]) -> Any:
    return lambda _mod, args: into.append(args[0].detach())


def _take_both(extra: _Extra) -> Any:
    def hook(_mod: nn.Module, args: tuple[torch.Tensor, ...], out: torch.Tensor) -> None:
        extra.norm_in.append(args[0].detach())
        extra.norm_out.append(out.detach())

    return hook


__all__ = ["BLOCK_FAMILIES", "LayerBlock", "Norm", "capture_blocks", "one_text", "refuse_unsupported"]
