"""Tracing the real bundled BERT and tiny models of every family: capture, recompute, check."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch

import attnscope
from attnscope.errors import AttnscopeError

TOL = attnscope.TOLERANCE
SENTENCE = "time flies like an arrow"
FAMILIES = ("bert", "roberta", "electra", "distilbert", "albert", "gpt2")


def test_minilm_trace_passes_its_check(minilm: attnscope.Model) -> None:
    tr = attnscope.trace(SENTENCE, model=minilm)
    assert (tr.n_layers, tr.n_heads, tr.n_tokens) == (6, 12, 7)
    assert tr.token_strings == ["[CLS]", "time", "flies", "like", "an", "arrow", "[SEP]"]
    report = tr.check()
    assert report.ok, report.to_dict()
    assert report.unsupported is None
    stages = {(c.stage, c.source) for c in report.comparisons}
    assert {("weights", "model"), ("x", "model"), ("output", "recompute"), ("scores", "recompute")} <= stages
    assert report.max_error <= TOL


def test_captured_weights_are_the_models_output_attentions(minilm: attnscope.Model) -> None:
    tr = attnscope.trace(SENTENCE, model=minilm)
    enc = minilm.tokenizer(SENTENCE, return_tensors="pt")
    with torch.no_grad():
        out = minilm.model(**enc, output_attentions=True, output_hidden_states=True)
    own = torch.stack(out.attentions)[:, 0].numpy()  # [layer, head, query, key], plain eager forward
    assert np.abs(tr.weights - own).max() <= TOL
    assert np.abs(tr.arrays["x"] - torch.stack(out.hidden_states[:-1])[:, 0].numpy()).max() <= TOL
    assert np.allclose(tr.weights.sum(-1), 1.0, atol=TOL)


def test_arrays_have_the_documented_axes(minilm: attnscope.Model) -> None:
    tr = attnscope.trace(SENTENCE, model=minilm)
    n = tr.n_tokens
    assert tr.arrays["x"].shape == (6, n, 384)  # [layer, token, d_model]
    assert tr.arrays["q"].shape == (6, 12, n, 32)  # [layer, head, token, d_head]
    assert tr.arrays["scores"].shape == (6, 12, n, n)  # [layer, head, query, key]
    assert tr.arrays["output"].shape == (6, n, 384)
    assert tr.scaling == pytest.approx([32**-0.5] * 6)


def test_padding_never_changes_a_number(minilm: attnscope.Model) -> None:
    alone = attnscope.trace(SENTENCE, model=minilm)
    batch = attnscope.trace(["a much longer sentence that will force padding on the short one", SENTENCE],
                            model=minilm)
    padded = batch[1]
    assert padded.n_tokens == alone.n_tokens
    for stage, arr in alone.arrays.items():
        assert np.abs(arr - padded.arrays[stage]).max() <= TOL * (max(1.0, np.abs(arr).max()) if stage == "scores"
                                                                    else 1.0), stage
    assert all(t.check().ok for t in batch)


def test_sentence_pair_uses_token_type_ids(minilm: attnscope.Model) -> None:
    tr = attnscope.trace("The cat sat.", "It was happy.", model=minilm)
    segments = [t.segment for t in tr.tokens]
    assert segments == [0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1]
    assert [t.text for t in tr.tokens if t.special] == ["[CLS]", "[SEP]", "[SEP]"]
    assert tr.check().ok
    swapped = attnscope.trace("It was happy.", "The cat sat.", model=minilm)
    assert swapped.n_tokens == tr.n_tokens and not np.allclose(swapped.weights, tr.weights)


def test_tokens_carry_offsets_word_ids_and_special_flags(minilm: attnscope.Model) -> None:
    text = "Tokenization splits unbelievable words"
    tr = attnscope.trace(text, model=minilm)
    pieces = [t for t in tr.tokens if not t.special]
    for t in pieces:
        assert t.start is not None and t.end is not None
        assert text[t.start:t.end].lower() == t.text.removeprefix("##")
    assert [t.word for t in pieces] == sorted(t.word for t in pieces if t.word is not None)
    assert any(t.text.startswith("##") for t in pieces)  # word pieces share the word id of their word
    first_word = [t.text for t in pieces if t.word == 0]
    assert "".join(p.removeprefix("##") for p in first_word) == "tokenization"


def test_chinese_text_is_split_into_characters(minilm: attnscope.Model) -> None:
    tr = attnscope.trace("北京大学", model=minilm)
    assert tr.token_strings == ["[CLS]", "北", "京", "大", "学", "[SEP]"]
    assert tr.check().ok


def test_long_text_is_truncated_with_a_flag_or_refused(minilm: attnscope.Model) -> None:
    long = " ".join(["word"] * 40)
    tr = attnscope.trace(long, model=minilm, max_length=16)
    assert tr.truncated and tr.n_tokens == 16 and tr.tokens[-1].text == "[SEP]"
    with pytest.raises(AttnscopeError, match="42 tokens long, over the maximum of 16"):
        attnscope.trace(long, model=minilm, max_length=16, truncate=False)


@pytest.mark.parametrize("bad", ["", "   \n\t"])
def test_empty_text_is_refused(minilm: attnscope.Model, bad: str) -> None:
    with pytest.raises(AttnscopeError, match="empty"):
        attnscope.trace(bad, model=minilm)


def test_out_of_range_indices_name_the_valid_range(minilm: attnscope.Model) -> None:
    tr = attnscope.trace(SENTENCE, model=minilm)
    with pytest.raises(AttnscopeError, match=r"layer 6 is out of range.*0\.\.5"):
        tr.head(6, 0)
    with pytest.raises(AttnscopeError, match=r"head 12 is out of range.*0\.\.11"):
        tr.head(0, 12)


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_is_captured_recomputed_and_verified(family: str,
                                                          tiny_model: Callable[[str], attnscope.Model]) -> None:
    m = tiny_model(family)
    batch = attnscope.trace([SENTENCE, "a second and noticeably longer sentence"], model=m)
    tr = batch[0]
    report = tr.check()
    assert report.ok and report.unsupported is None, report.to_dict()
    assert {c.stage for c in report.comparisons if c.source == "recompute"} == {
        "q", "k", "v", "scores", "weights", "context", "output"}
    assert {c.stage for c in report.comparisons if c.source == "model"} == {"x", "weights"}
    alone = attnscope.trace(SENTENCE, model=m)
    assert np.abs(alone.weights - tr.weights).max() <= TOL
    assert tr.causal == (family == "gpt2")
    if tr.causal:
        assert np.triu(tr.weights, 1).max() == 0.0


def test_albert_shares_one_set_of_weights_across_layers(tiny_model: Callable[[str], attnscope.Model]) -> None:
    tr = attnscope.trace(SENTENCE, model=tiny_model("albert"))
    assert tr.n_layers == 3 and tr.check().ok
    assert not np.allclose(tr.weights[0], tr.weights[1])  # same weights, different inputs


def test_other_families_are_traced_but_never_pass(minilm: attnscope.Model) -> None:
    import transformers as T

    torch.manual_seed(0)
    cfg = T.Starcoder2Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                             intermediate_size=128, vocab_size=30522)
    m = attnscope.load_model(T.Starcoder2Model(cfg).eval(), tokenizer=minilm.tokenizer)
    tr = attnscope.trace(SENTENCE, model=m)
    assert tr.unsupported is not None and "'starcoder2' (Starcoder2Model)" in tr.unsupported
    assert tr.weights.shape == (2, 4, 7, 7) and tr.causal
    assert tr.arrays["k"].shape[1] == 2 and tr.kv_heads == 2  # k/v kept per k/v head, not repeated
    report = tr.check()
    assert [c.source for c in report.comparisons] == ["model"] and report.ok
    assert not report.verified and report.status == "NOT VERIFIED"  # the captured weights equal themselves


def test_the_check_catches_a_model_that_differs_from_the_maths(tiny_model: Callable[[str], attnscope.Model]) -> None:
    m = tiny_model("bert")
    attn = m.model.encoder.layer[1].attention.self
    original = attn.scaling
    attn.scaling = original * 1.01  # the forward pass now scales differently from 1/sqrt(d_head)
    try:
        report = attnscope.trace(SENTENCE, model=m).check()
    finally:
        attn.scaling = original
    assert not report.ok
    bad = {c.stage for c in report.comparisons if not np.all(c.errors <= report.tolerance)}
    assert bad >= {"weights", "context"} and not bad & {"q", "k", "v", "scores"}
    weights = next(c for c in report.comparisons if c.stage == "weights" and c.source == "recompute")
    assert np.all(weights.errors[0] <= report.tolerance) and np.all(weights.errors[1] > report.tolerance)


def test_nan_fails_the_check_rather_than_disappearing(tiny_model: Callable[[str], attnscope.Model]) -> None:
    m = tiny_model("bert")
    value = m.model.encoder.layer[1].attention.self.value
    saved = value.weight.detach().clone()
    with torch.no_grad():
        value.weight[3, 5] = float("nan")  # one broken weight in layer 1
    try:
        tr = attnscope.trace(SENTENCE, model=m)
    finally:
        with torch.no_grad():
            value.weight.copy_(saved)
    assert np.isnan(tr.arrays["v"][1]).any() and not np.isnan(tr.arrays["v"][0]).any()  # kept, not replaced
    report = tr.check()
    assert not report.ok
    assert np.isnan(report.worst("v") or 0.0)


def test_a_forward_pass_is_checked_while_the_next_one_runs(minilm: attnscope.Model) -> None:
    """trace = forward_pass(...).finish(); finish reads only what its forward pass left, so the server checks one
    text in a thread while the model runs the next (attnscope.serve.service): the same errors and arrays.

    One torch thread: with several, two threads calling torch at once may each get fewer workers, and a matrix
    product split another way rounds differently (1.4e-06 against 0.0 seen in a loaded CI run), which says
    nothing about what finish reads; on one thread every product sums in one order, so any difference is a leak.
    (The thread count is each thread's own setting: the checking thread sets it too.)"""
    from concurrent.futures import ThreadPoolExecutor

    from attnscope.placement import using_threads
    from attnscope.tracing.one_pass import forward_pass

    texts = [SENTENCE, "The capital of France is Paris, and it is big."]
    with using_threads(1):
        alone = [attnscope.trace(t, model=minilm) for t in texts]
        first = forward_pass(texts[0], model=minilm)
        with ThreadPoolExecutor(1, initializer=torch.set_num_threads, initargs=(1,)) as pool:  # per thread
            checked = pool.submit(first.finish)
            second = forward_pass(texts[1], model=minilm)  # the model runs while the first text is checked
            together = [checked.result()[0], second.finish()[0]]
    for a, b in zip(alone, together, strict=True):
        assert a.check().to_dict() == b.check().to_dict() and b.check().ok
        assert all(np.array_equal(a.arrays[s], b.arrays[s]) for s in a.arrays)
