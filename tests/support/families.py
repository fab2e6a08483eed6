"""Tiny random-weight models of the modern families (RoPE, grouped-query attention, sliding windows, QK-norm,
soft-capping, sinks) from small configs: the family, generation and intervention tests build them alike."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

WINDOW = 4  # tokens: the family tests' texts are longer, so the sliding layers hide keys
SMALL: dict[str, Any] = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                             vocab_size=30522, pad_token_id=0, bos_token_id=101, eos_token_id=102)


def modern_configs() -> dict[str, Callable[[], Any]]:
    import transformers as T

    gqa = dict(SMALL, num_key_value_heads=2)
    return {
        "llama": lambda: T.LlamaConfig(**gqa),
        "mistral": lambda: T.MistralConfig(**gqa, sliding_window=WINDOW),
        "qwen2": lambda: T.Qwen2Config(**gqa, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1),
        "qwen3": lambda: T.Qwen3Config(**dict(SMALL, num_key_value_heads=1), head_dim=8),  # MQA + QK-norm per head
        "gemma2": lambda: T.Gemma2Config(**gqa, head_dim=16, sliding_window=WINDOW, query_pre_attn_scalar=12,
                                         attn_logit_softcapping=5.0),
        # QK-norm scaling by 1 + w, one k/v head, a local (sliding) layer and a global one with their own RoPE bases
        "gemma3_text": lambda: T.Gemma3TextConfig(
            **dict(SMALL, num_key_value_heads=1), head_dim=16, sliding_window=WINDOW, query_pre_attn_scalar=12,
            layer_types=["sliding_attention", "full_attention"],
            rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                             "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0}}),
        "phi3": lambda: T.Phi3Config(**gqa, partial_rotary_factor=0.5, sliding_window=WINDOW),
        "gpt_neox": lambda: T.GPTNeoXConfig(**SMALL),  # rotary_pct 0.25: partial rotary
        "olmo2": lambda: T.Olmo2Config(**gqa),  # QK-norm over the whole projection
        "gpt_oss": lambda: T.GptOssConfig(**dict(gqa, intermediate_size=64), head_dim=16, sliding_window=WINDOW,
                                          num_local_experts=2, num_experts_per_tok=1),  # sinks, YaRN
        "modernbert": lambda: T.ModernBertConfig(**dict(SMALL, num_hidden_layers=3), local_attention=2 * WINDOW,
                                                 global_attn_every_n_layers=2, cls_token_id=101, sep_token_id=102),
    }


def build_model(config: Any, head: str = "") -> torch.nn.Module:
    import transformers as T

    torch.manual_seed(0)
    name = type(config).__name__.removesuffix("Config")
    if head and name == "Gemma3Text":  # Gemma 3's text-only LM is Gemma3ForCausalLM, its base Gemma3TextModel
        name = "Gemma3"
    cls = getattr(T, f"{name}{head or 'Model'}")
    model: torch.nn.Module = cls(config)
    return model.eval()


def gemma3_multimodal() -> torch.nn.Module:
    """A tiny random-weight Gemma3ForConditionalGeneration: the gemma3_text config above as its text part and a
    one-layer SigLIP vision tower (text-only inputs never run it). Eager attention, as load_model loads a
    checkpoint: an untouched forward then runs the same maths as an intervened one."""
    import transformers as T

    vision = T.SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                  image_size=28, patch_size=14)
    config = T.Gemma3Config(text_config=modern_configs()["gemma3_text"]().to_dict(), vision_config=vision.to_dict(),
                            mm_tokens_per_image=4)
    torch.manual_seed(0)
    model = T.Gemma3ForConditionalGeneration(config)
    model.set_attn_implementation("eager")
    return model.eval()
