"""The encoder-decoder run of the views tests: a tiny random-weight BART with the bundled WordPiece tokenizer,
traced by attnscope.trace_seq2seq (captured, recomputed and verified per kind)."""

from __future__ import annotations

from typing import Any

import torch

import attnscope
from attnscope.records.trace import EncoderDecoderTrace
from attnscope.tracing.seq2seq import trace_seq2seq

SOURCE = "the cat sat on the mat near the door"  # 11 tokens with [CLS] and [SEP]
TARGET = "die katze <script>"  # 8 decoder tokens (shifted right behind [SEP], the decoder start), one of them markup


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


def bart_trace(minilm: attnscope.Model, source: str = SOURCE, target: str = TARGET) -> EncoderDecoderTrace:
    """The tiny BART's encoder, decoder and cross-attention on source -> target (teacher forcing)."""
    tok = minilm.tokenizer
    model = attnscope.load_model(bart(tok.vocab_size), tokenizer=tok)
    return trace_seq2seq(source, target=target, model=model, max_length=64)


def t5(vocab: int) -> Any:
    """A tiny random-weight T5: 2 encoder and 2 decoder layers x 4 heads (d_head 16), no 1/sqrt(d) scaling, and a
    relative position bias in the self-attention of each side."""
    import transformers as T

    torch.manual_seed(0)
    config = T.T5Config(vocab_size=vocab, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2,
                        num_heads=4, decoder_start_token_id=0, pad_token_id=0, eos_token_id=102)
    model = T.T5ForConditionalGeneration(config)
    model.config._attn_implementation = "eager"
    return model.eval()


def t5_trace(minilm: attnscope.Model, source: str = SOURCE, target: str = TARGET) -> EncoderDecoderTrace:
    tok = minilm.tokenizer
    return trace_seq2seq(source, target=target, model=attnscope.load_model(t5(tok.vocab_size), tokenizer=tok),
                         max_length=64)
