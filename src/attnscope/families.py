"""One small adapter per model family: where attention lives and how to read its weights.

Capture works for any model whose attention goes through transformers' attention
registry; the adapter is needed only for the independent recompute (parameters in the
x @ W convention) and for naming the output projection that gives the `output` stage.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from attnscope.maths import AttentionParams


@dataclass(frozen=True)
class Family:
    """How to read one architecture family's attention modules."""

    name: str
    attention_classes: tuple[str, ...]  # modules that call the attention function
    causal: bool
    params: Callable[[nn.Module, Any, int], AttentionParams]  # (model, attention module, layer)
    out_proj: Callable[[nn.Module, Any], nn.Module]  # (model, attention module) -> projection
    x_source: str  # one line for the walkthrough: where the attention input x comes from
    pre_attention: str | None = None  # module applied to the hidden state to give x, "{layer}" filled in


def _linear_t(lin: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """nn.Linear stores [out, in] and computes x W^T + b; return W^T [in, out] and b."""
    assert isinstance(lin, nn.Linear)
    return lin.weight.detach().T, None if lin.bias is None else lin.bias.detach()


def _linear_params(q: Any, k: Any, v: Any, o: Any, n_heads: int) -> AttentionParams:
    (w_q, b_q), (w_k, b_k), (w_v, b_v), (w_o, b_o) = (_linear_t(m) for m in (q, k, v, o))
    d_head = w_q.shape[1] // n_heads
    return AttentionParams(w_q, b_q, w_k, b_k, w_v, b_v, w_o, b_o, n_heads, d_head**-0.5)


def _sibling(model: nn.Module, module: nn.Module, rel: str) -> nn.Module:
    """The module at `<parent of module>.<rel>`, e.g. BERT's `attention.self` -> `attention.output.dense`."""
    for name, mod in model.named_modules():
        if mod is module:
            parent = name.rsplit(".", 1)[0] if "." in name else ""
            return model.get_submodule(f"{parent}.{rel}" if parent else rel)
    raise LookupError(f"{type(module).__name__} is not part of {type(model).__name__}")


def _bert_params(model: nn.Module, m: Any, layer: int) -> AttentionParams:
    out = _sibling(model, m, "output.dense")
    return _linear_params(m.query, m.key, m.value, out, int(m.num_attention_heads))


def _distilbert_params(model: nn.Module, m: Any, layer: int) -> AttentionParams:
    return _linear_params(m.q_lin, m.k_lin, m.v_lin, m.out_lin, int(m.n_heads))


def _albert_params(model: nn.Module, m: Any, layer: int) -> AttentionParams:
    return _linear_params(m.query, m.key, m.value, m.dense, int(m.num_attention_heads))


def _gpt2_params(model: nn.Module, m: Any, layer: int) -> AttentionParams:
    """GPT-2's Conv1D already stores [in, out] (x W + b); c_attn fuses q, k, v along out."""
    w, b = m.c_attn.weight.detach(), m.c_attn.bias.detach()  # [d_model, 3 d_model], [3 d_model]
    w_q, w_k, w_v = w.split(m.embed_dim, dim=1)
    b_q, b_k, b_v = b.split(m.embed_dim, dim=0)
    scaling = float(m.head_dim) ** -0.5 if m.scale_attn_weights else 1.0
    if m.scale_attn_by_inverse_layer_idx:
        scaling /= float(layer + 1)
    w_o, b_o = m.c_proj.weight.detach(), m.c_proj.bias.detach()
    return AttentionParams(w_q, b_q, w_k, b_k, w_v, b_v, w_o, b_o, int(m.num_heads), scaling)


def _bert_family(name: str, cls_prefix: str) -> Family:
    return Family(
        name=name,
        attention_classes=(f"{cls_prefix}SelfAttention",),
        causal=False,
        params=_bert_params,
        out_proj=lambda model, m: _sibling(model, m, "output.dense"),
        x_source="layer 0: token + position + segment embeddings, then LayerNorm; "
        "layer l > 0: the output of layer l-1",
    )


FAMILIES: dict[str, Family] = {
    "bert": _bert_family("bert", "Bert"),
    "roberta": _bert_family("roberta", "Roberta"),
    "electra": _bert_family("electra", "Electra"),
    "distilbert": Family(
        name="distilbert",
        attention_classes=("DistilBertSelfAttention",),
        causal=False,
        params=_distilbert_params,
        out_proj=lambda model, m: m.out_lin,
        x_source="layer 0: token + position embeddings, then LayerNorm; layer l > 0: the output of layer l-1",
    ),
    "albert": Family(
        name="albert",
        attention_classes=("AlbertAttention",),
        causal=False,
        params=_albert_params,
        out_proj=lambda model, m: m.dense,
        x_source="layer 0: token + position + segment embeddings, LayerNorm, then the embedding-to-hidden "
        "projection; layer l > 0: the output of layer l-1 (all layers share one set of weights)",
    ),
    "gpt2": Family(
        name="gpt2",
        attention_classes=("GPT2Attention",),
        causal=True,
        params=_gpt2_params,
        out_proj=lambda model, m: m.c_proj,
        x_source="ln_1 (LayerNorm) of the residual stream: token + position embeddings for layer 0, "
        "the output of layer l-1 after that",
        pre_attention="h.{layer}.ln_1",
    ),
}


def family_of(model: nn.Module) -> Family | None:
    """The family adapter for a model, or None when attnscope cannot recompute it."""
    return FAMILIES.get(str(getattr(model.config, "model_type", "")))


def is_causal(model: nn.Module) -> bool:
    """Whether the model's self-attention hides future tokens."""
    fam = family_of(model)
    if fam is not None:
        return fam.causal
    return bool(getattr(model.config, "is_decoder", False)) or "CausalLM" in type(model).__name__
