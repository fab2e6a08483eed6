"""A real encoder-decoder run for the views tests: a random-weight BART with the bundled WordPiece tokenizer.

q, k and v are the model's own projections (forward hooks on q_proj, k_proj, v_proj), the weights its own
output_attentions, scores = q k^T and context = weights v; `softmax_error` says how far softmax(scores x
scaling + mask) is from the model's weights, so a test can hold the data to 1e-5. The traces carry no
verification of attnscope's (`unsupported` says so), as a saved or hand-built trace would not.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from attnscope.tokens import Token
from attnscope.traces import EncoderDecoderTrace, Trace

SOURCE = "the cat sat on the mat near the door"
TARGET = "die katze <script>"  # the target's own tokens, one of them markup
NOT_CHECKED = "built in the views tests from the model's own projections: attnscope did not recompute it"


def bart(vocab: int) -> Any:
    """A tiny random-weight BART: 2 encoder layers x 4 heads, 3 decoder layers x 2 heads (d_head 16 and 32)."""
    import transformers as T

    torch.manual_seed(0)
    config = T.BartConfig(vocab_size=vocab, d_model=64, encoder_layers=2, decoder_layers=3, encoder_attention_heads=4,
                          decoder_attention_heads=2, encoder_ffn_dim=128, decoder_ffn_dim=128,
                          max_position_embeddings=128, pad_token_id=0, bos_token_id=101, eos_token_id=102,
                          decoder_start_token_id=102)
    model = T.BartForConditionalGeneration(config)
    model.config._attn_implementation = "eager"
    return model.eval()


def _tokens(tokenizer: Any, ids: list[int]) -> list[Token]:
    texts = tokenizer.convert_ids_to_tokens(ids)
    special = set(tokenizer.all_special_ids)
    pairs = enumerate(zip(texts, ids, strict=True))
    return [Token(i, t, int(x), None, None, int(x) in special, None, 0) for i, (t, x) in pairs]


def _heads(x: torch.Tensor, d_head: int) -> np.ndarray:
    """[1, token, head * d_head] -> [head, token, d_head]"""
    return x[0].view(x.shape[1], -1, d_head).transpose(0, 1).numpy()


def _capture(model: Any, src: torch.Tensor, tgt: torch.Tensor) -> tuple[Any, dict[str, list[dict[str, np.ndarray]]]]:
    """Run the model once; per kind and layer the q, k, v its attention modules projected."""
    modules = {"encoder": [lay.self_attn for lay in model.model.encoder.layers],
               "decoder": [lay.self_attn for lay in model.model.decoder.layers],
               "cross": [lay.encoder_attn for lay in model.model.decoder.layers]}
    seen: dict[str, list[dict[str, np.ndarray]]] = {kind: [{} for _ in mods] for kind, mods in modules.items()}
    hooks = []
    for kind, mods in modules.items():
        for layer, attn in enumerate(mods):
            for stage in ("q", "k", "v"):
                def keep(_m: Any, _i: Any, out: torch.Tensor, kind: str = kind, layer: int = layer, stage: str = stage,
                         d: int = attn.head_dim) -> None:
                    seen[kind][layer][stage] = _heads(out.detach(), d)
                hooks.append(getattr(attn, f"{stage}_proj").register_forward_hook(keep))
    try:
        with torch.no_grad():
            out = model(input_ids=src, decoder_input_ids=tgt, output_attentions=True, use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    return out, seen


def _trace(kind: str, layers: list[dict[str, np.ndarray]], weights: tuple[torch.Tensor, ...], tokens: list[Token],
           keys: list[Token] | None, text: str, scaling: float) -> Trace:
    w = np.stack([a[0].numpy() for a in weights]).astype(np.float32)  # [layer, head, query, key]
    q, k, v = (np.stack([lay[s] for lay in layers]) for s in ("q", "k", "v"))  # [layer, head, token, d_head]
    arrays = {"q": q, "k": k, "v": v, "scores": q @ k.transpose(0, 1, 3, 2), "weights": w, "context": w @ v}
    info = {"name": "random-weight BART (views test)", "architecture": "BartForConditionalGeneration",
            "layers": len(layers), "heads": int(w.shape[1]), "causal": kind == "decoder", "family": "bart"}
    return Trace(info, text, None, tokens, arrays, [scaling] * len(layers), unsupported=NOT_CHECKED, attention=kind,
                 key_tokens=keys)


def bart_trace(model: Any, tokenizer: Any, source: str = SOURCE, target: str = TARGET) -> EncoderDecoderTrace:
    """The encoder, decoder and cross-attention of `model` on source -> target (teacher forcing: the target's ids
    shifted right behind the decoder start token)."""
    src_ids = tokenizer(source)["input_ids"]
    labels = tokenizer(target)["input_ids"]
    tgt_ids = [model.config.decoder_start_token_id, *labels[:-1]]
    out, seen = _capture(model, torch.tensor([src_ids]), torch.tensor([tgt_ids]))
    src, tgt = _tokens(tokenizer, src_ids), _tokens(tokenizer, tgt_ids)
    enc_scaling = float(model.model.encoder.layers[0].self_attn.scaling)  # 1 / sqrt(d_head) of each side
    dec_scaling = float(model.model.decoder.layers[0].self_attn.scaling)
    enc = _trace("encoder", seen["encoder"], out.encoder_attentions, src, None, source, enc_scaling)
    dec = _trace("decoder", seen["decoder"], out.decoder_attentions, tgt, None, target, dec_scaling)
    cross = _trace("cross", seen["cross"], out.cross_attentions, tgt, src, target, dec_scaling)
    return EncoderDecoderTrace({"name": enc.model["name"]}, source, target, enc, dec, cross)


def softmax_error(trace: Trace) -> float:
    """max |softmax(scores x scaling + mask) - the model's weights| over every layer and head."""
    scaled = trace.arrays["scores"].astype(np.float64) * np.asarray(trace.scaling)[:, None, None, None]
    if trace.causal:
        scaled = np.where(np.triu(np.ones(scaled.shape[-2:], dtype=bool), 1), -np.inf, scaled)
    e = np.exp(scaled - scaled.max(-1, keepdims=True))
    return float(np.abs(e / e.sum(-1, keepdims=True) - trace.weights).max())
