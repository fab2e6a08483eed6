"""The adapters: one small `Family` per model family (weights in the x @ W convention, options from the config).

`attnscope.families` reads models through these; nothing else in attnscope knows an architecture.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from attnscope.maths import AttentionParams, QKNorm, Window

SCALED_ROPE = ("linear", "dynamic", "llama3", "yarn")  # rope_type values recomputed besides "default"


class Unsupported(Exception):
    """A step of a layer that attnscope cannot recompute; the message names it."""


@dataclass(frozen=True)
class BlockNorms:
    """Where a layer's attention block ends and which norms it holds, for decompositions of the whole block
    (attribution.alti: the residual, the norms and the block output). Module names are "{layer}"-formatted.

    post: y = LayerNorm(x + attention output); `post_norm` is that LayerNorm, relative to the attention module's
      parent (BERT's <layer>.attention.self -> <layer>.attention.output.LayerNorm).
    pre: y = x + attention(norm(x)); `block_output` (relative to the base model) is the module whose input is y.
    sandwich: y = x + RMSNorm(attention output); `attention_norm` is that RMSNorm (scaling by 1 + w where
      unit_offset), `block_output` the module whose input is y.
    """

    kind: str  # "post" | "pre" | "sandwich"
    post_norm: str | None = None
    block_output: str | None = None
    attention_norm: str | None = None
    unit_offset: bool = False


_POST_BERT = BlockNorms("post", post_norm="output.LayerNorm")
_PRE_LLAMA = BlockNorms("pre", block_output="layers.{layer}.post_attention_layernorm")
_SANDWICH_GEMMA = BlockNorms("sandwich", block_output="layers.{layer}.pre_feedforward_layernorm",
                             attention_norm="layers.{layer}.post_attention_layernorm", unit_offset=True)


@dataclass(frozen=True)
class Family:
    """How to read one architecture family's attention modules."""

    name: str
    attention_classes: tuple[str, ...]  # modules that call the attention function
    causal: bool
    params: Callable[[nn.Module, Any, int], AttentionParams]  # (model, attention module, layer), no rotation yet
    out_proj: Callable[[nn.Module, Any], nn.Module]  # (model, attention module) -> projection
    x_source: str  # one line for the walkthrough: where the attention input x comes from
    pre_attention: str | None = None  # base-model module applied to the hidden state to give x, "{layer}" filled in
    rotary: bool = False  # RoPE from config.rope_parameters
    shared_layers: bool = False  # one attention module serves every layer (ALBERT)
    cross: str | None = None  # encoder-decoder: the name of the decoder's cross-attention modules
    unit_offset: bool = False  # RMSNorm weights stored as w, scaling by 1 + w (Gemma 3's QK-norm)
    block_norms: BlockNorms | None = None  # the whole attention block's norms (None: ALTI does not decompose it)


def text_config(config: Any) -> Any:
    """The config of the text transformer: a multimodal model's `text_config` (Gemma3ForConditionalGeneration's
    Gemma3TextConfig), the config itself for every other model."""
    return getattr(config, "text_config", None) or config


def _linear_t(lin: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """nn.Linear stores [out, in] and computes x W^T + b; return W^T [in, out] and b."""
    assert isinstance(lin, nn.Linear)
    return lin.weight.detach().T, None if lin.bias is None else lin.bias.detach()


def _linear_params(q: Any, k: Any, v: Any, o: Any, n_heads: int) -> AttentionParams:
    (w_q, b_q), (w_k, b_k), (w_v, b_v), (w_o, b_o) = (_linear_t(m) for m in (q, k, v, o))
    d_head = w_q.shape[1] // n_heads
    return AttentionParams(w_q, b_q, w_k, b_k, w_v, b_v, w_o, b_o, n_heads, d_head**-0.5)


_NAMES: weakref.WeakKeyDictionary[nn.Module, dict[int, str]] = weakref.WeakKeyDictionary()


def module_name(model: nn.Module, module: nn.Module) -> str:
    """The module's name inside model ("" for model itself), from one walk of model's modules cached per model
    (a walk visits every module; the hooks and params ask once per layer and per call). The cached name is used
    only while it still names that very module (a replaced submodule rebuilds the cache)."""
    names = _NAMES.get(model)
    name = None if names is None else names.get(id(module))
    if name is None or not _names(model, name, module):
        names = {id(mod): n for n, mod in model.named_modules()}
        _NAMES[model] = names
        name = names.get(id(module))
        if name is None:
            raise LookupError(f"{type(module).__name__} is not part of {type(model).__name__}")
    return name


def submodule(model: nn.Module, name: str) -> nn.Module:
    """model.get_submodule(name), read along each module's registered children (a dictionary lookup per dotted part:
    ~1 us where get_submodule's checks take ~15 us, and ALTI's capture asks ~40 times a call); get_submodule itself,
    with its error, where the path is not all registered children."""
    mod = model
    try:
        for part in name.split(".") if name else []:
            mod = mod._modules[part]  # type: ignore[assignment]  # a registered child is a Module or None
    except KeyError:
        return model.get_submodule(name)
    if mod is None:
        return model.get_submodule(name)
    return mod


def _names(model: nn.Module, name: str, module: nn.Module) -> bool:
    """Whether name still names module inside model (a module removed since: no)."""
    try:
        return submodule(model, name) is module
    except AttributeError:
        return False


def _sibling(model: nn.Module, module: nn.Module, rel: str) -> nn.Module:
    """The module at `<parent of module>.<rel>`, e.g. BERT's `attention.self` -> `attention.output.dense`."""
    name = module_name(model, module)
    parent = name.rsplit(".", 1)[0] if "." in name else ""
    return submodule(model, f"{parent}.{rel}" if parent else rel)


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


# Modern families: sizes and options come from the config, never from the module's own attributes,
# so a module that computes something else shows up in the check.
def _head_dim(cfg: Any) -> int:
    return int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)


def _kv_heads(cfg: Any) -> int:
    return int(getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads)


def _scaling(cfg: Any) -> float:
    scalar = getattr(cfg, "query_pre_attn_scalar", None)  # Gemma 2 scales by it instead of d_head
    return float(float(scalar if scalar is not None else _head_dim(cfg)) ** -0.5)


def _window(cfg: Any, layer: int, causal: bool) -> Window:
    """The keys a layer sees: layer_types name the sliding layers; otherwise sliding_window applies to all."""
    size = getattr(cfg, "sliding_window", None)
    types = getattr(cfg, "layer_types", None)
    if size is None or (types is not None and types[layer] != "sliding_attention"):
        return Window() if not causal else Window(None, 0)
    if not causal:  # ModernBERT: |i - j| <= sliding_window (half of local_attention)
        return Window(int(size), int(size))
    return Window(int(size) - 1, 0)  # transformers: key j > i - sliding_window


def _qk_norm(norm: Any, per_head: bool, unit_offset: bool = False) -> QKNorm:
    """The norm's weight as it scales: Gemma 3 stores w and scales by 1 + w (computed in float32, as its
    Gemma3RMSNorm does each forward pass: the same float32 sum)."""
    weight = norm.weight.detach()
    if unit_offset:
        weight = 1.0 + weight.float()
    eps = getattr(norm, "variance_epsilon", None)
    return QKNorm(weight, float(norm.eps if eps is None else eps), per_head)


def _split_params(model: nn.Module, m: Any, layer: int, w: tuple[torch.Tensor, ...],
                  b: tuple[torch.Tensor | None, ...], out: nn.Module) -> AttentionParams:
    """W_Q, W_K, W_V [d_model, width] and their biases, with the family's options from the config."""
    cfg: Any = text_config(model.config)
    w_o, b_o = _linear_t(out)
    # Qwen3 normalises each head ([d_head] weight), OLMo2 the whole projection ([head * d_head])
    fam = FAMILIES[str(cfg.model_type)]
    q_norm, k_norm = (_qk_norm(getattr(m, n), int(getattr(m, n).weight.shape[0]) == _head_dim(cfg), fam.unit_offset)
                      if hasattr(m, n) else None for n in ("q_norm", "k_norm"))
    causal = fam.causal
    sinks = m.sinks.detach() if isinstance(getattr(m, "sinks", None), torch.Tensor) else None  # GPT-OSS
    return AttentionParams(
        w[0], b[0], w[1], b[1], w[2], b[2], w_o, b_o, int(cfg.num_attention_heads), _scaling(cfg),
        n_kv_heads=_kv_heads(cfg), q_norm=q_norm, k_norm=k_norm, softcap=getattr(cfg, "attn_logit_softcapping", None),
        window=_window(cfg, layer, causal), sinks=sinks,
    )


def _qkv_proj_params(model: nn.Module, m: Any, layer: int) -> AttentionParams:
    """Llama, Mistral, Qwen2/3, Gemma 2, OLMo2: q_proj, k_proj, v_proj, o_proj."""
    (w_q, b_q), (w_k, b_k), (w_v, b_v) = (_linear_t(p) for p in (m.q_proj, m.k_proj, m.v_proj))
    return _split_params(model, m, layer, (w_q, w_k, w_v), (b_q, b_k, b_v), m.o_proj)


def _phi3_params(model: nn.Module, m: Any, layer: int) -> AttentionParams:
    """Phi-3's qkv_proj fuses [q | k | v] along its output: head * d_head, then kv_head * d_head twice."""
    cfg: Any = text_config(model.config)
    w, b = _linear_t(m.qkv_proj)  # [d_model, (head + 2 kv_head) d_head]
    sizes = [int(cfg.num_attention_heads) * _head_dim(cfg), *[_kv_heads(cfg) * _head_dim(cfg)] * 2]
    biases = (None,) * 3 if b is None else tuple(torch.split(b, sizes))
    return _split_params(model, m, layer, tuple(torch.split(w, sizes, dim=1)), biases, m.o_proj)


def _neox_params(model: nn.Module, m: Any, layer: int) -> AttentionParams:
    """GPT-NeoX's query_key_value is per head [q_h | k_h | v_h]: gather each kind's columns head by head."""
    cfg: Any = text_config(model.config)
    w, b = _linear_t(m.query_key_value)  # [d_model, head * 3 d_head]
    d, h = _head_dim(cfg), int(cfg.num_attention_heads)
    cols = torch.arange(h * 3 * d).view(h, 3, d)  # [head, q|k|v, d_head]
    ws = tuple(w[:, cols[:, i].reshape(-1)] for i in range(3))
    bs = (None,) * 3 if b is None else tuple(b[cols[:, i].reshape(-1)] for i in range(3))
    return _split_params(model, m, layer, ws, bs, m.dense)


def _modernbert_params(model: nn.Module, m: Any, layer: int) -> AttentionParams:
    """ModernBERT's Wqkv is [q | k | v] along its output, each head * d_head wide."""
    w, b = _linear_t(m.Wqkv)
    width = w.shape[1] // 3
    biases = (None,) * 3 if b is None else tuple(torch.split(b, width))
    return _split_params(model, m, layer, tuple(torch.split(w, width, dim=1)), biases, m.Wo)


def _bert_family(name: str, cls_prefix: str) -> Family:
    return Family(
        name=name,
        attention_classes=(f"{cls_prefix}SelfAttention",),
        causal=False,
        params=_bert_params,
        out_proj=lambda model, m: _sibling(model, m, "output.dense"),
        x_source="layer 0: token + position + segment embeddings, then LayerNorm; "
        "layer l > 0: the output of layer l-1",
        block_norms=_POST_BERT,
    )


_DECODER_X = ("{norm} of the residual stream: the token embeddings{scaled} for layer 0, the output of "
              "layer l-1 after that (positions enter through the rotation of q and k, not through x)")


def _decoder(name: str, cls: str, params: Callable[[nn.Module, Any, int], AttentionParams] = _qkv_proj_params,
             out: str = "o_proj", norm: str = "input_layernorm (RMSNorm)", scaled: str = "",
             pre: str | None = "layers.{layer}.input_layernorm", unit_offset: bool = False,
             block_norms: BlockNorms | None = None) -> Family:
    return Family(name, (cls,), True, params, lambda model, m: getattr(m, out),
                  _DECODER_X.format(norm=norm, scaled=scaled), pre_attention=pre, rotary=True,
                  unit_offset=unit_offset, block_norms=block_norms)


# Encoder-decoder families: one attention class serves the encoder's self-attention, the decoder's causal
# self-attention and the decoder's cross-attention; a module's place in the model says which (attention_kind).
def _t5_params(model: nn.Module, m: Any, layer: int) -> AttentionParams:
    """T5: no biases and no 1/sqrt(d_head) scaling (its initialisation folds it into W_Q); seq2seq_params adds
    the relative position bias."""
    cfg: Any = model.config
    return replace(_linear_params(m.q, m.k, m.v, m.o, int(cfg.num_heads)), scaling=1.0)


def _bart_params(model: nn.Module, m: Any, layer: int) -> AttentionParams:
    """BART, mBART, Marian: q_proj, k_proj, v_proj, out_proj with biases, scores scaled by 1/sqrt(d_head)."""
    cfg: Any = model.config  # the decoder's self- and cross-attention modules say is_decoder, the encoder's not
    heads = cfg.decoder_attention_heads if m.is_decoder else cfg.encoder_attention_heads
    return _linear_params(m.q_proj, m.k_proj, m.v_proj, m.out_proj, int(heads))


_SEQ2SEQ_X = {
    "t5": "layer_norm (RMS, no mean, no bias) of the residual stream: the token embeddings for layer 0, the output "
          "of layer l-1 after that (positions enter through the relative position bias, not through x); "
          "cross-attention: the same norm of the decoder's stream after its self-attention, k and v from the "
          "encoder's output (after its final RMS norm)",
    "bart": "the residual stream after LayerNorm: token {scaled}+ {positions} position embeddings, then layernorm_"
            "embedding, for layer 0, the output of layer l-1 after that; cross-attention: the decoder's stream after "
            "its self-attention block, k and v from the encoder's output",
}


def _seq2seq(name: str, cls: str, params: Callable[[nn.Module, Any, int], AttentionParams], cross: str,
             x_source: str, out: str, pre: str | None = None) -> Family:
    return Family(name, (cls,), False, params, lambda model, m: getattr(m, out), x_source, pre_attention=pre,
                  cross=cross)


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
        block_norms=BlockNorms("post", post_norm="sa_layer_norm"),  # <layer>.sa_layer_norm beside <layer>.attention
    ),
    "albert": Family(
        name="albert",
        attention_classes=("AlbertAttention",),
        causal=False,
        params=_albert_params,
        out_proj=lambda model, m: m.dense,
        x_source="layer 0: token + position + segment embeddings, LayerNorm, then the embedding-to-hidden "
        "projection; layer l > 0: the output of layer l-1 (all layers share one set of weights)",
        shared_layers=True,
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
        block_norms=BlockNorms("pre", block_output="h.{layer}.ln_2"),
    ),
    "llama": _decoder("llama", "LlamaAttention", block_norms=_PRE_LLAMA),
    "mistral": _decoder("mistral", "MistralAttention", block_norms=_PRE_LLAMA),
    "qwen2": _decoder("qwen2", "Qwen2Attention", block_norms=_PRE_LLAMA),
    "qwen3": _decoder("qwen3", "Qwen3Attention", block_norms=_PRE_LLAMA),
    "gemma2": _decoder("gemma2", "Gemma2Attention", scaled=" times sqrt(d_model)", block_norms=_SANDWICH_GEMMA),
    # Gemma 3: QK-norm scaling by 1 + w, local (sliding) and global layers with their own RoPE bases
    "gemma3_text": _decoder("gemma3_text", "Gemma3Attention", scaled=" times sqrt(d_model)",
                            norm="input_layernorm (RMSNorm, scaling by 1 + w)", unit_offset=True,
                            block_norms=_SANDWICH_GEMMA),
    "phi3": _decoder("phi3", "Phi3Attention", params=_phi3_params, block_norms=_PRE_LLAMA),
    "gpt_neox": _decoder("gpt_neox", "GPTNeoXAttention", params=_neox_params, out="dense",
                         norm="input_layernorm (LayerNorm)"),
    "gpt_oss": _decoder("gpt_oss", "GptOssAttention"),  # attention sinks, alternating sliding layers, YaRN
    "olmo2": _decoder("olmo2", "Olmo2Attention", norm="no norm (OLMo2 normalises after attention): x is",
                      pre=None),
    "t5": _seq2seq("t5", "T5Attention", _t5_params, "EncDecAttention", _SEQ2SEQ_X["t5"], "o",
                   pre="{stack}.block.{layer}.layer.0.layer_norm"),
    "bart": _seq2seq("bart", "BartAttention", _bart_params, "encoder_attn",
                     _SEQ2SEQ_X["bart"].format(scaled="", positions="learned"), "out_proj"),
    "mbart": _seq2seq("mbart", "MBartAttention", _bart_params, "encoder_attn",
                      "self_attn_layer_norm (LayerNorm, before attention) of the residual stream: scaled token + "
                      "learned position embeddings, then layernorm_embedding, for layer 0, the output of layer l-1 "
                      "after that; cross-attention: encoder_attn_layer_norm of the decoder's stream, k and v from "
                      "the encoder's output (after its final LayerNorm)", "out_proj",
                      pre="{stack}.layers.{layer}.self_attn_layer_norm"),
    "marian": _seq2seq("marian", "MarianAttention", _bart_params, "encoder_attn",
                       "the residual stream: token embeddings x sqrt(d_model) + sinusoidal position embeddings for "
                       "layer 0 (no LayerNorm there), the output of layer l-1 after that (post-norm); "
                       "cross-attention: the decoder's stream after its self-attention block, k and v from the "
                       "encoder's output", "out_proj"),
    "modernbert": Family(
        name="modernbert",
        attention_classes=("ModernBertAttention",),
        causal=False,
        params=_modernbert_params,
        out_proj=lambda model, m: m.Wo,
        x_source="layer 0: token embeddings, then LayerNorm; layer l > 0: attn_norm (LayerNorm) of the output "
        "of layer l-1 (positions enter through the rotation of q and k)",
        pre_attention="layers.{layer}.attn_norm",
        rotary=True,
    ),
}
