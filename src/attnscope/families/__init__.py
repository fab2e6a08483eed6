"""One small adapter per model family: the only package that knows architecture details.

The adapters (`Family`, one per model_type) are in `attnscope.families.adapters`; this module reads
models through them: which modules attend, causality, parameters per layer, the rotation, and why a
model is not supported.

Capture works for any model whose attention goes through transformers' attention registry;
the adapter is needed for the independent recompute (parameters in the x @ W convention, the
rotation, grouped k/v heads, QK-norm, soft-capping, windows), for naming the output projection
that gives the `output` stage, and for the config keys, causality and weight sharing of each
family. Base models and head models (*ForCausalLM, *ForMaskedLM) are read the same way.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from attnscope.families.adapters import FAMILIES, SCALED_ROPE, Family, Unsupported, _head_dim, submodule, text_config
from attnscope.maths import AttentionParams, RelativeBias, Rope, Window


def family_of(model: nn.Module) -> Family | None:
    """The family adapter for a model (base or head model), or None when attnscope cannot recompute it."""
    return FAMILIES.get(str(getattr(text_config(model.config), "model_type", "")))


def base_of(model: nn.Module) -> nn.Module:
    """The text transformer under a head model (LlamaForCausalLM -> LlamaModel), under a multimodal model its
    language model (Gemma3ForConditionalGeneration -> Gemma3TextModel); the model itself otherwise."""
    base = getattr(model, "base_model", None)
    base = base if isinstance(base, nn.Module) else model
    language = getattr(base, "language_model", None)
    return language if isinstance(language, nn.Module) else base


def n_layers(config: Any) -> int:
    return int(getattr(config, "num_hidden_layers", None) or getattr(config, "n_layer", 0) or 0)


def n_heads(config: Any) -> int:
    return int(getattr(config, "num_attention_heads", None) or getattr(config, "n_head", 0) or 0)


def max_positions(config: Any) -> int:
    return int(getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None) or 512)


def is_causal(model: nn.Module, module: nn.Module | None = None) -> bool:
    """Whether the model's self-attention hides future tokens (for other families: the attention module's
    own is_causal flag when one is given, else the config and class name)."""
    fam = family_of(model)
    if fam is not None:
        return fam.causal
    if module is not None and hasattr(module, "is_causal"):
        return bool(module.is_causal)
    return bool(getattr(text_config(model.config), "is_decoder", False)) or "CausalLM" in type(model).__name__


def _attention_of(model: nn.Module) -> Iterator[nn.Module]:
    """The modules that call the attention function, once each and in order, found as the walk reaches them."""
    fam = family_of(model)
    if fam is not None:
        yield from (m for m in model.modules() if type(m).__name__ in fam.attention_classes)


def attention_modules(model: nn.Module) -> list[nn.Module]:
    """The modules that call the attention function, once each, for a family attnscope knows."""
    return list(_attention_of(model))


def has_attention_modules(model: nn.Module) -> bool:
    """Whether attention_modules(model) finds any: the walk stops at the first (a whole one visits every module,
    a third of a millisecond on MiniLM)."""
    return next(_attention_of(model), None) is not None


def layer_modules(model: nn.Module) -> list[nn.Module]:
    """One attention module per layer: ALBERT's single shared module repeated for each layer."""
    fam, mods = family_of(model), attention_modules(model)
    if fam is not None and fam.shared_layers and len(mods) == 1:
        return mods * max(1, n_layers(text_config(model.config)))
    return mods


def eager_attention(module: nn.Module) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """The eager attention function of the module's own modeling file (BERT's when it has none)."""
    fn = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
    if callable(fn):
        return fn  # type: ignore[no-any-return]
    from transformers.models.bert import modeling_bert

    return modeling_bert.eager_attention_forward


def pre_attention(model: nn.Module, layer: int, stack: str = "encoder") -> nn.Module | None:
    """The module that turns layer's hidden state into its attention input, or None when x is the hidden state.

    stack: an encoder-decoder's "encoder" or "decoder" (self-attention)."""
    fam = family_of(model)
    if fam is None or fam.pre_attention is None:
        return None
    return submodule(base_of(model), fam.pre_attention.format(layer=layer, stack=stack))


def is_encoder_decoder(model: nn.Module) -> bool:
    """T5, BART, Marian...: an encoder reads the source, a decoder the target with cross-attention to it."""
    return bool(getattr(model.config, "is_encoder_decoder", False))


def attention_kind(model: nn.Module, module: nn.Module) -> str:
    """"self" for a decoder-only or encoder-only model; an encoder-decoder's "encoder", "decoder" or "cross"."""
    kinds = seq2seq_modules(model)
    return next((kind for kind, mods in kinds.items() if any(m is module for m in mods)), "self")


def seq2seq_modules(model: nn.Module) -> dict[str, list[nn.Module]]:
    """An encoder-decoder's attention modules by kind ("encoder", "decoder", "cross"), each in layer order."""
    fam = family_of(model)
    if fam is None or fam.cross is None:
        return {}
    kinds: dict[str, list[nn.Module]] = {"encoder": [], "decoder": [], "cross": []}
    for name, mod in model.named_modules():
        if type(mod).__name__ in fam.attention_classes:
            parts = name.split(".")
            kinds["cross" if fam.cross in parts else "encoder" if "encoder" in parts else "decoder"].append(mod)
    return kinds


def seq2seq_params(model: nn.Module) -> dict[str, list[AttentionParams]]:
    """Each kind's per-layer parameters: the decoder's self-attention sees no later key; T5 adds the relative
    position bias of its stack's first layer (bidirectional in the encoder) to every self-attention layer."""
    fam, cfg = family_of(model), text_config(model.config)
    assert fam is not None and fam.cross is not None
    out: dict[str, list[AttentionParams]] = {}
    for kind, mods in seq2seq_modules(model).items():
        params = [fam.params(model, m, layer) for layer, m in enumerate(mods)]
        first = getattr(mods[0], "relative_attention_bias", None) if mods else None
        if isinstance(first, nn.Embedding):
            table = RelativeBias(first.weight.detach(), kind == "encoder",
                                 int(getattr(cfg, "relative_attention_max_distance", 128)))
            params = [replace(p, relative_bias=table) for p in params]
        if kind == "decoder":
            params = [replace(p, window=Window(None, 0)) for p in params]
        out[kind] = params
    return out


def rope(config: Any, layer: int, n_positions: int) -> Rope:
    """The layer's rotary frequencies theta_i for a text of n_positions tokens (dynamic scaling depends on it)."""
    rp = dict(config.rope_parameters or {})
    layer_type = None
    if "rope_type" not in rp and getattr(config, "layer_types", None):  # ModernBERT: one set per layer type
        layer_type = config.layer_types[layer]
        rp = dict(rp[layer_type])
    kind = str(rp.get("rope_type", "default"))
    if kind == "default":
        dim = int(_head_dim(config) * float(rp.get("partial_rotary_factor", 1.0)))
        inv_freq = 1.0 / (float(rp["rope_theta"]) ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
        return Rope(inv_freq, 1.0, kind)
    if kind not in SCALED_ROPE:
        raise Unsupported(f"RoPE scaling {kind!r} (recomputed: default, {', '.join(SCALED_ROPE)})")
    # the scaled variants' frequencies as transformers computes them; the rotation itself is attnscope's
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    extra = {"layer_type": layer_type} if layer_type is not None else {}
    inv_freq, factor = ROPE_INIT_FUNCTIONS[kind](config, None, seq_len=n_positions, **extra)
    return Rope(inv_freq.float(), float(factor), kind)


def why_unsupported(model: nn.Module) -> str | None:
    """None when attnscope recomputes every layer of this model; otherwise the step it cannot recompute."""
    fam = family_of(model)
    if fam is None:
        kind = getattr(text_config(model.config), "model_type", "?")
        return (f"no attnscope adapter for model type {kind!r} ({type(model).__name__}): q, k, v and every "
                f"later step are not recomputed")
    if not attention_modules(model):
        return f"no {'/'.join(fam.attention_classes)} module found in {type(model).__name__}"
    if fam.rotary:
        try:
            layer_ropes(text_config(model.config), 1)
        except Unsupported as exc:
            return f"{exc} is not recomputed"
    return None


def layer_params(model: nn.Module, n_positions: int = 1) -> list[AttentionParams] | None:
    """Each layer's attention parameters, with the rotation for texts of n_positions tokens, or None when
    the model cannot be recomputed (why_unsupported says why)."""
    fam = family_of(model)
    if fam is None or why_unsupported(model) is not None:
        return None
    params = [fam.params(model, m, layer) for layer, m in enumerate(layer_modules(model))]
    if fam.causal:  # a decoder sees no key after its query
        params = [replace(p, window=Window(p.window.before, 0)) for p in params]
    if fam.rotary:
        ropes = layer_ropes(text_config(model.config), n_positions)
        params = [replace(p, rope=r) for p, r in zip(params, ropes, strict=True)]
    return params


def layer_ropes(config: Any, n_positions: int) -> list[Rope]:
    """Every layer's rotation (see rope); layers of one type (ModernBERT's local and global ones) share one
    Rope, computed once: a layer's frequencies depend on nothing else."""
    types = getattr(config, "layer_types", None) or [None] * n_layers(config)
    by_type: dict[Any, Rope] = {}
    for layer, kind in enumerate(types):
        if kind not in by_type:
            by_type[kind] = rope(config, layer, n_positions)
    return [by_type[kind] for kind in types]


__all__ = ["FAMILIES", "SCALED_ROPE", "Family", "Unsupported", "attention_kind", "attention_modules", "base_of",
           "eager_attention", "family_of", "has_attention_modules", "is_causal", "is_encoder_decoder", "layer_modules",
           "layer_params", "layer_ropes", "max_positions", "n_heads", "n_layers", "pre_attention", "rope",
           "seq2seq_modules", "seq2seq_params", "submodule", "text_config", "why_unsupported"]
