"""Encoder-decoder models (T5, BART, mBART, Marian): the three kinds of attention captured, recomputed, verified.

Random-weight models from small configs with the bundled MiniLM tokenizer (tests/support/seq2seq.py).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

import attnscope
from attnscope.errors import AttnscopeError
from attnscope.records.check_report import tolerance_for
from tests.support.seq2seq import FAMILIES

SOURCES = ["the cat sat on the mat near the door", "hello"]
TARGETS = ["die katze sass", "guten tag lieber freund wie geht es dir"]
RECOMPUTED = {"q", "k", "v", "scores", "weights", "context", "output"}


@pytest.fixture(scope="session")
def batches(seq2seq: Callable[[str], attnscope.Model]) -> dict[str, list[attnscope.EncoderDecoderTrace]]:
    """Each family on a padded batch of two sources and two targets (the second source is the shorter,
    the second target the longer: both sides are padded)."""
    return {f: attnscope.trace_seq2seq(SOURCES, TARGETS, model=seq2seq(f)) for f in FAMILIES}


def _expected(family: str, kind: str) -> set[tuple[str, str]]:
    pairs = {(s, "recompute") for s in RECOMPUTED} | {("weights", "model")}
    pairs |= {("memory", "model")} if kind == "cross" else {("x", "model")}
    if family == "t5" and kind != "cross":
        pairs.add(("position_bias", "recompute"))
    return pairs


@pytest.mark.parametrize("family", FAMILIES)
def test_every_stage_of_the_three_kinds_passes_on_a_padded_batch(
        family: str, batches: dict[str, list[attnscope.EncoderDecoderTrace]]) -> None:
    for tr in batches[family]:
        reports = tr.check()
        assert tr.status() == "PASS", {k: r.to_dict() for k, r in reports.items()}
        for kind, report in reports.items():
            assert report.tolerance == 1e-5 and report.verified
            assert {(c.stage, c.source) for c in report.comparisons} == _expected(family, kind), kind
            assert all(c.errors.shape[0] == tr.attention(kind).n_layers for c in report.comparisons)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_kinds_hold_their_own_tokens_and_the_models_own_attentions(
        family: str, batches: dict[str, list[attnscope.EncoderDecoderTrace]],
        seq2seq: Callable[[str], attnscope.Model]) -> None:
    m = seq2seq(family)
    for row, tr in enumerate(batches[family]):
        enc, dec, cross = tr.encoder, tr.decoder, tr.cross
        assert (enc.attention, dec.attention, cross.attention) == ("encoder", "decoder", "cross")
        assert not enc.causal and dec.causal and not cross.causal
        assert cross.keys == enc.tokens and cross.tokens == dec.tokens and dec.keys == dec.tokens
        assert cross.weights.shape == (2, 4, dec.n_tokens, enc.n_tokens)
        assert cross.arrays["k"].shape[2] == enc.n_tokens and cross.arrays["memory"].shape == (enc.n_tokens, 64)
        np.testing.assert_allclose(cross.weights.sum(-1), 1.0, atol=1e-5)
        assert np.all(np.triu(dec.weights, 1) == 0.0)  # causal: no weight on a later target token
        # the same row run alone: the model's own attentions equal the trace's (padding cut off)
        src = m.tokenizer(SOURCES[row], return_tensors="pt")
        labels = m.tokenizer(text_target=TARGETS[row], return_tensors="pt")["input_ids"]
        decoder_ids = m.model.prepare_decoder_input_ids_from_labels(labels=labels)
        assert [t.id for t in dec.tokens] == decoder_ids[0].tolist()  # teacher forcing: shifted right
        start = labels[0, -1] if family == "mbart" else m.model.config.decoder_start_token_id  # mBART: the last label
        assert dec.tokens[0].id == start and dec.tokens[0].special
        assert [t.text for t in dec.tokens[1:]] == m.tokenizer.convert_ids_to_tokens(labels[0, :-1].tolist())
        with torch.no_grad():
            out = m.model(**src, decoder_input_ids=decoder_ids, output_attentions=True)
        for kind, theirs in (("encoder", out.encoder_attentions), ("decoder", out.decoder_attentions),
                             ("cross", out.cross_attentions)):
            np.testing.assert_allclose(tr.attention(kind).weights, torch.stack(theirs)[:, 0].numpy(), atol=1e-6)


@pytest.mark.parametrize("family", ["t5", "marian"])
def test_without_a_target_the_greedy_generation_is_traced(family: str,
                                                          seq2seq: Callable[[str], attnscope.Model]) -> None:
    m = seq2seq(family)
    tr = attnscope.trace_seq2seq(SOURCES[0], model=m, max_new_tokens=6)
    src = m.tokenizer(SOURCES[0], return_tensors="pt")
    with torch.no_grad():
        seq = m.model.generate(input_ids=src["input_ids"], attention_mask=src["attention_mask"], max_new_tokens=6,
                               do_sample=False, num_beams=1)[0].tolist()
    assert tr.generated and tr.target is None
    assert [t.id for t in tr.decoder.tokens] == seq[:-1]  # the step that produced each token is a row
    assert tr.target_text == m.tokenizer.decode(seq[1:], skip_special_tokens=True)
    assert tr.status() == "PASS"


def test_a_wrong_position_bias_fails_in_its_own_stage(seq2seq: Callable[[str], attnscope.Model]) -> None:
    m = seq2seq("t5")
    first = m.model.encoder.block[0].layer[0].SelfAttention
    saved = first.relative_attention_max_distance
    first.relative_attention_max_distance = 10  # the model now buckets distances unlike its config says
    try:
        tr = attnscope.trace_seq2seq(SOURCES[0], TARGETS[0], model=m)
    finally:
        first.relative_attention_max_distance = saved
    reports = tr.check()
    assert reports["encoder"].status == "FAIL"
    assert reports["decoder"].status == "PASS" and reports["cross"].status == "PASS"
    bad = {c.stage for c in reports["encoder"].comparisons if not np.all(c.errors <= 1e-5)}
    assert "position_bias" in bad and "weights" in bad and "q" not in bad


def test_a_wrong_cross_attention_layer_fails_there_only(seq2seq: Callable[[str], attnscope.Model]) -> None:
    m = seq2seq("bart")
    cross = m.model.model.decoder.layers[1].encoder_attn
    saved = cross.scaling
    cross.scaling = saved * 1.01  # this layer now scales its scores unlike 1/sqrt(d_head)
    try:
        tr = attnscope.trace_seq2seq(SOURCES[0], TARGETS[0], model=m)
    finally:
        cross.scaling = saved
    reports = tr.check()
    assert tr.status() == "FAIL" and reports["cross"].status == "FAIL"
    assert reports["encoder"].status == "PASS" and reports["decoder"].status == "PASS"
    weights = next(c for c in reports["cross"].comparisons if (c.stage, c.source) == ("weights", "recompute"))
    assert np.all(weights.errors[0] <= 1e-5) and np.all(weights.errors[1] > 1e-5)  # layer 1 (0-indexed) only


def test_bad_input_is_one_line(seq2seq: Callable[[str], attnscope.Model], minilm: attnscope.Model) -> None:
    m = seq2seq("bart")
    cases: list[tuple[Callable[[], object], str]] = [
        (lambda: attnscope.trace_seq2seq("a source", "a target", model=minilm), "is not an encoder-decoder model"),
        (lambda: attnscope.trace("a text", model=m), "is an encoder-decoder model"),
        (lambda: attnscope.trace_seq2seq("a source", "  ", model=m), "the target is empty"),
        (lambda: attnscope.trace_seq2seq("", "a target", model=m), "the source is empty"),
        (lambda: attnscope.trace_seq2seq("a source " * 20, "t", model=m, max_length=8, truncate=False), "over"),
        (lambda: attnscope.trace_seq2seq("s", "a target " * 20, model=m, max_length=8, truncate=False), "over"),
        (lambda: attnscope.trace_seq2seq(["a", "b"], ["x"], model=m), "one target per source"),
        (lambda: attnscope.trace_seq2seq("a", model=m, max_new_tokens=0), "max_new_tokens"),
    ]
    for call, words in cases:
        with pytest.raises(AttnscopeError, match=words) as info:
            call()
        assert "\n" not in str(info.value)
    import transformers as T

    pegasus = T.PegasusForConditionalGeneration(T.PegasusConfig(
        vocab_size=30522, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, pad_token_id=0, eos_token_id=102))
    with pytest.raises(AttnscopeError, match=r"no attnscope adapter for the encoder-decoder model type 'pegasus'.*"
                                             "use one of t5, bart, mbart, marian"):
        attnscope.trace_seq2seq("a source", "a target", model=attnscope.load_model(pegasus, tokenizer=m.tokenizer))
    with pytest.raises(AttnscopeError, match="use encoder, decoder or cross"):
        attnscope.trace_seq2seq("a source", "a target", model=m).attention("self")


@pytest.mark.parametrize("suffix", [".safetensors", ".npz"])
def test_save_and_load_keep_the_kinds_apart(suffix: str, batches: dict[str, list[attnscope.EncoderDecoderTrace]],
                                            tmp_path: Path) -> None:
    tr = batches["t5"][1]
    path = tmp_path / f"t{suffix}"
    tr.save(path)
    loaded = attnscope.EncoderDecoderTrace.load(path)
    assert (loaded.source, loaded.target, loaded.model) == (tr.source, tr.target, tr.model)
    for kind, theirs in tr.kinds.items():
        mine = loaded.attention(kind)
        assert (mine.attention, mine.tokens, mine.keys, mine.text) == (theirs.attention, theirs.tokens, theirs.keys,
                                                                       theirs.text)
        assert set(mine.arrays) == set(theirs.arrays)
        for stage, array in theirs.arrays.items():
            assert np.array_equal(mine.arrays[stage], array), (kind, stage)
        assert mine.check().to_dict() == theirs.check().to_dict()
    assert loaded.cross.arrays["memory"].shape == (tr.encoder.n_tokens, 64)
    with pytest.raises(AttnscopeError, match="holds an encoder-decoder trace"):
        attnscope.Trace.load(path)
    tr.decoder.save(tmp_path / f"d{suffix}")  # one kind alone is a plain trace
    assert attnscope.Trace.load(tmp_path / f"d{suffix}").attention == "decoder"
    with pytest.raises(AttnscopeError, match="not an encoder-decoder trace"):
        attnscope.EncoderDecoderTrace.load(tmp_path / f"d{suffix}")


def test_derived_maps_of_each_kind(batches: dict[str, list[attnscope.EncoderDecoderTrace]]) -> None:
    tr = batches["marian"][0]
    assert tr.decoder.rollout().shape == (2, tr.decoder.n_tokens, tr.decoder.n_tokens)
    norms = tr.encoder.norms()["norm_head"]  # ||alpha_ij f(x_j)||
    assert norms.shape == (2, 4, tr.encoder.n_tokens, tr.encoder.n_tokens) and np.all(norms >= 0)
    with pytest.raises(AttnscopeError, match="cross-attention's \\[target, source\\] maps do not compose"):
        tr.cross.rollout()


def test_bfloat16_is_checked_in_float32_at_its_tolerance(seq2seq: Callable[[str], attnscope.Model]) -> None:
    tr = attnscope.trace_seq2seq(SOURCES, TARGETS, model=seq2seq("t5"), dtype="bfloat16")[1]
    reports = tr.check()
    assert tr.model["dtype"] == "bfloat16" and tr.status() == "PASS", {k: r.to_dict() for k, r in reports.items()}
    assert {r.tolerance for r in reports.values()} == {tolerance_for("bfloat16")}
    assert tr.cross.weights.dtype == np.float32


def test_without_the_recompute_nothing_says_pass(seq2seq: Callable[[str], attnscope.Model]) -> None:
    tr = attnscope.trace_seq2seq(SOURCES[0], TARGETS[0], model=seq2seq("bart"), recompute=False)
    assert tr.status() == "NOT VERIFIED" and all(not r.comparisons for r in tr.check().values())
    assert tr.cross.unsupported == "traced with recompute=False" and tr.cross.weights.shape[2:] == (
        tr.decoder.n_tokens, tr.encoder.n_tokens)
