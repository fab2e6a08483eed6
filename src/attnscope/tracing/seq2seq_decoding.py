"""Watch an encoder-decoder model translate: each new target token, its probability and its cross-attention over
the source (the alignment), every step verified.

The model writes greedily with its own `generate` loop and KV cache (the encoder runs once; each step feeds the
decoder one token, its keys and values cached), returning each step's attentions. `trace_seq2seq` traces the
same target in one teacher-forced pass and verifies that pass stage by stage (recompute from the weights, and the
model's own outputs). Each step's rows from the generate loop are then compared with the trace's rows of the
same query (stage "weights", source "generate"): the decoder's self-attention row and the cross-attention row of
every layer and head, and the encoder's attention. So every step's attention is the recomputed one within the
tolerance.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from attnscope import families
from attnscope.errors import AttnscopeError, require_text
from attnscope.models import Model, ModelLike, load_model
from attnscope.records.check_report import Comparison
from attnscope.records.generation import GeneratedToken
from attnscope.records.trace import EncoderDecoderTrace
from attnscope.records.translation import Seq2SeqGeneration
from attnscope.tokens import piece_decoder
from attnscope.tracing.decoding import spelled, top_alternatives, validate_settings
from attnscope.tracing.seq2seq import trace_seq2seq, validate_encoder_decoder


def generate_seq2seq(source: str, model: ModelLike = None, max_new_tokens: int = 20, alternatives: int = 5,
                     max_length: int | None = None) -> Seq2SeqGeneration:
    """Translate (or summarise) source greedily, one target token at a time, every step's attention verified.

    Stops at the model's end-of-sequence token or after max_new_tokens. max_length bounds the source's tokens.
    """
    require_text(source, "source", parameter="source")
    validate_settings(max_new_tokens, None, None, None, alternatives)
    m = load_model(model)
    if not families.is_encoder_decoder(m.model):
        raise AttnscopeError(f"{m.name} ({m.architecture}) is not an encoder-decoder model: generate_seq2seq "
                             "translates with T5, BART or Marian; a decoder writes with attnscope.generate",
                             parameter="model")
    validate_encoder_decoder(m)  # a family attnscope has an adapter for
    tr = trace_seq2seq(source, model=m, max_length=max_length, max_new_tokens=max_new_tokens)
    ids = torch.tensor([[t.id for t in tr.encoder.tokens]])  # [1, source]: the very tokens the trace read
    with torch.no_grad():
        out = m.model.generate(  # type: ignore[operator]
            input_ids=ids.to(m.device), attention_mask=torch.ones_like(ids).to(m.device),
            max_new_tokens=max_new_tokens, do_sample=False, num_beams=1, output_attentions=True, output_scores=True,
            return_dict_in_generate=True)
    written = out.sequences[0].tolist()[1:]  # after the decoder start token
    n_steps = tr.decoder.n_tokens
    if written[: n_steps - 1] != [t.id for t in tr.decoder.tokens[1:]]:
        raise AttnscopeError(f"{m.name} generated two different targets for one source: greedy generation is not "
                             "deterministic here, so the steps cannot be verified")
    steps = _steps(m, written[:n_steps], out.scores, alternatives)
    _compare_steps(tr, out, n_steps)
    ends = _end_ids(m)
    stopped = "eos" if steps[-1].id in ends else "max_new_tokens"
    return Seq2SeqGeneration(tr, steps, {"max_new_tokens": max_new_tokens, "do_sample": False}, stopped)


def _end_ids(m: Model) -> set[int]:
    eos = m.model.generation_config.eos_token_id
    return set(eos if isinstance(eos, list) else [] if eos is None else [eos])


def _steps(m: Model, written: list[int], scores: tuple[torch.Tensor, ...], k: int) -> list[GeneratedToken]:
    """Each written token with its probability and the top k alternatives: the softmax of the logits after the
    generation config's processors (what greedy search took the maximum of), as for decoders."""
    tok, steps, text = m.tokenizer, [], ""
    decode = piece_decoder(tok)
    special = set(tok.all_special_ids)
    for s, token_id in enumerate(written):
        logp = torch.log_softmax(scores[s][0].float().cpu(), dim=-1)  # [vocab]
        decoded = str(tok.decode(written[: s + 1], skip_special_tokens=True))
        piece, text = decoded[len(text):], decoded
        spelling, alone = spelled(tok, decode, token_id)
        steps.append(GeneratedToken(step=s, position=s + 1, id=token_id, text=spelling, decoded=alone, piece=piece,
                                    probability=float(logp[token_id].exp()),
                                    alternatives=top_alternatives(tok, decode, logp, k), special=token_id in special))
    return steps


def _compare_steps(tr: EncoderDecoderTrace, out: Any, n_steps: int) -> None:
    """Each step's attention rows from the generate loop vs the trace's: a "generate" comparison per kind."""
    dec, cross = tr.decoder.weights, tr.cross.weights  # [layer, head, target, target|source]
    dec_err = np.zeros(dec.shape[:2])  # [layer, head]: the max over steps
    cross_err = np.zeros(cross.shape[:2])
    for s in range(n_steps):
        for layer in range(dec.shape[0]):
            d = out.decoder_attentions[s][layer][0, :, -1, : s + 1].float().cpu().numpy()  # [head, key]
            c = out.cross_attentions[s][layer][0, :, -1, :].float().cpu().numpy()  # [head, source]
            dec_err[layer] = np.maximum(dec_err[layer], _row_error(d, dec[layer, :, s, : s + 1]))
            cross_err[layer] = np.maximum(cross_err[layer], _row_error(c, cross[layer, :, s, :]))
    enc = np.stack([_row_error(a[0].float().cpu().numpy(), tr.encoder.weights[layer])
                    for layer, a in enumerate(out.encoder_attentions)])  # [layer, head]
    for t, errors in ((tr.encoder, enc), (tr.decoder, dec_err), (tr.cross, cross_err)):
        t.comparisons = [*t.comparisons, Comparison("weights", "generate", errors)]


def _row_error(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """max |a - b| per head of [head, ...] arrays (NaN stays NaN)."""
    diff: np.ndarray = np.abs(a.astype(np.float64) - b.astype(np.float64)).reshape(a.shape[0], -1)
    worst: np.ndarray = diff.max(axis=1)  # [head]
    return worst


__all__ = ["generate_seq2seq"]
