"""Tiny random-weight encoder-decoder models (T5, BART, mBART, Marian) with the bundled MiniLM tokenizer.

Ids follow the MiniLM WordPiece vocabulary: [PAD] 0, [CLS] 101 (bos), [SEP] 102 (eos). T5 and Marian start the
decoder with the pad token, BART with eos, as their real checkpoints do; mBART's teacher-forced decoder input
starts with the labels' last token (eos here, its language id in a real checkpoint).
"""

from __future__ import annotations

import torch
import transformers as T

import attnscope

FAMILIES = ("t5", "bart", "mbart", "marian")
_IDS = dict(vocab_size=30522, pad_token_id=0, bos_token_id=101, eos_token_id=102)
_BART = dict(d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
             encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=512, **_IDS)


def build(family: str) -> torch.nn.Module:
    """A random-weight model of that family (seed 0), eval mode, eager attention."""
    torch.manual_seed(0)
    if family == "t5":
        model: torch.nn.Module = T.T5ForConditionalGeneration(T.T5Config(
            d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2, num_heads=4,
            relative_attention_num_buckets=8, relative_attention_max_distance=20, decoder_start_token_id=0, **_IDS))
    elif family == "bart":
        model = T.BartForConditionalGeneration(T.BartConfig(**_BART, decoder_start_token_id=102))
    elif family == "mbart":
        # mBART's decoder input starts with the labels' last token (its language id), not this start token
        model = T.MBartForConditionalGeneration(T.MBartConfig(**_BART, decoder_start_token_id=101))
    elif family == "marian":
        model = T.MarianMTModel(T.MarianConfig(**_BART, decoder_start_token_id=0))
    else:
        raise ValueError(family)
    model.set_attn_implementation("eager")  # T5 keeps a config per stack: set them all
    return model.eval()


def tiny_seq2seq(family: str, minilm: attnscope.Model) -> attnscope.Model:
    return attnscope.load_model(build(family), tokenizer=minilm.tokenizer)
