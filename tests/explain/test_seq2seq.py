"""explain on encoder-decoder models: the cross-attention walkthrough (q from the decoder, k and v from the encoder's
output), T5's relative position bias as its own step, the kinds chosen with attention=/--attention.

Random-weight T5 and BART with the bundled MiniLM tokenizer (tests/support/seq2seq.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import attnscope
from attnscope import maths
from attnscope.cli.main import main
from attnscope.errors import AttnscopeError
from attnscope.explain.from_trace import walkthrough
from attnscope.explain.render import to_text, walkthrough_json, walkthrough_markdown, walkthrough_renderables
from tests.support.seq2seq import tiny_seq2seq

SOURCE, TARGET = "the cat sat on the mat", "die katze sass"
CROSS = ["tokens", "x", "memory", "projections", "q", "k", "v", "scores", "scaled", "masked", "weights", "context",
         "merged", "output"]


@pytest.fixture(scope="module")
def t5(minilm: attnscope.Model) -> tuple[attnscope.Model, attnscope.EncoderDecoderTrace]:
    m = tiny_seq2seq("t5", minilm)
    return m, attnscope.trace_seq2seq(SOURCE, TARGET, model=m)


@pytest.fixture(scope="module")
def bart(minilm: attnscope.Model) -> tuple[attnscope.Model, attnscope.EncoderDecoderTrace]:
    m = tiny_seq2seq("bart", minilm)
    return m, attnscope.trace_seq2seq(SOURCE, TARGET, model=m)


def _steps(w: attnscope.Walkthrough) -> dict[str, attnscope.explain.from_trace.Step]:
    return {s.stage: s for s in w.steps}


def test_cross_attention_reads_q_from_the_decoder_and_k_v_from_the_encoder_output(
        bart: tuple[attnscope.Model, attnscope.EncoderDecoderTrace]) -> None:
    m, tr = bart
    w = walkthrough(tr, layer=1, head=3, model=m)  # no attention=: the cross-attention, the default
    assert w.attention == "cross" and [s.stage for s in w.steps] == CROSS
    assert "the default" in w.steps[0].text and w.check["ok"] and w.check["head_max_error"] <= 1e-5
    st, cross = _steps(w), tr.cross
    assert np.array_equal(st["x"].arrays["x"], cross.arrays["x"][1])  # [target, d_model]: the decoder's
    assert np.array_equal(st["memory"].arrays["memory"], cross.arrays["memory"])  # [source, d_model]
    assert st["memory"].row_labels == [f"{i}:{t.text}" for i, t in enumerate(tr.encoder.tokens)]
    assert np.array_equal(st["k"].arrays["k"], cross.arrays["k"][1, 3])
    assert np.array_equal(st["weights"].arrays["weights"], cross.weights[1, 3])
    assert st["weights"].arrays["weights"].shape == (tr.decoder.n_tokens, tr.encoder.n_tokens)
    assert st["scores"].col_labels == st["memory"].row_labels and st["scores"].row_labels == st["x"].row_labels
    # k = memory W_K + b_K with the real layer's weights, recomputed here from the shown memory
    attn = m.model.model.decoder.layers[1].encoder_attn
    k = attn.k_proj(torch.from_numpy(cross.arrays["memory"])).detach().numpy()[:, 48:64]  # head 3 of 4, d_head 16
    np.testing.assert_allclose(st["k"].arrays["k"], k, atol=1e-5)
    assert np.allclose(st["scaled"].arrays["scaled"], cross.arrays["scores"][1, 3] * 0.25, atol=1e-6)
    assert not st["masked"].arrays["mask"].any() and "every source token" in st["masked"].text
    assert "within" in st["memory"].text and "encoder_last_hidden_state" in st["memory"].text


def test_t5_position_bias_is_its_own_step_with_buckets_and_the_models_table(
        t5: tuple[attnscope.Model, attnscope.EncoderDecoderTrace]) -> None:
    m, tr = t5
    table = m.model.encoder.block[0].layer[0].SelfAttention.relative_attention_bias.weight.detach().numpy()
    for kind, bidirectional in (("encoder", True), ("decoder", False)):
        w = walkthrough(tr, layer=1, head=2, model=m, attention=kind)
        stages = [s.stage for s in w.steps]
        assert stages.index("scaled") + 1 == stages.index("position_bias") == stages.index("masked") - 1
        st = _steps(w)
        step = st["position_bias"].arrays
        n = tr.attention(kind).n_tokens
        relative = np.arange(n)[None, :] - np.arange(n)[:, None]
        assert np.array_equal(step["key - query"], relative)
        buckets = maths.relative_position_bucket(torch.from_numpy(relative), bidirectional, 8, 20).numpy()
        assert np.array_equal(step["bucket"], buckets)
        if kind == "decoder":  # one-sided: every later key shares bucket 0
            table = m.model.decoder.block[0].layer[0].SelfAttention.relative_attention_bias.weight.detach().numpy()
            assert not step["bucket"][np.triu_indices(n, 1)].any()
        assert np.array_equal(step["bias table of head 2 (bucket -> value)"][0], table[:, 2])
        assert np.array_equal(step["position_bias"], tr.attention(kind).arrays["position_bias"][1, 2])
        np.testing.assert_allclose(step["position_bias"], table[buckets, 2], atol=1e-6)
        masked = st["masked"].arrays["masked"]
        expected = st["scaled"].arrays["scaled"] + step["position_bias"] + st["masked"].arrays["mask"]
        assert np.array_equal(masked, expected) and "T5 does not divide" in st["scaled"].text
        assert w.check["ok"]
    cross = [s.stage for s in walkthrough(tr, 0, 0, model=m, attention="cross").steps]
    assert "position_bias" not in cross and "memory" in cross  # T5's cross-attention has no position bias


def test_renders_name_the_kind_and_the_bucket_labels(t5: tuple[attnscope.Model, attnscope.EncoderDecoderTrace],
                                                     ) -> None:
    m, tr = t5
    w = walkthrough(tr, layer=0, head=1, token=2, model=m, attention="encoder")
    text = to_text(walkthrough_renderables(w, width=140), width=140)
    assert "encoder self-attention, layer 0, head 1, query token 2" in text
    assert "Relative position bias (T5)" in text and "head 1 │" in text  # the bias table's own row label
    md = walkthrough_markdown(w)
    assert "## 9. Relative position bias (T5) (`position_bias`)" in md
    data = walkthrough_json(walkthrough(tr, layer=0, head=1, model=m))
    assert data["attention"] == "cross" and [t["text"] for t in data["key_tokens"]] == tr.encoder.token_strings
    weights = next(s for s in data["steps"] if s["stage"] == "weights")
    assert np.array_equal(np.asarray(weights["arrays"]["weights"], dtype=np.float32), tr.cross.weights[0, 1])
    assert json.loads(json.dumps(data)) == data


def test_attention_errors_are_one_line(t5: tuple[attnscope.Model, attnscope.EncoderDecoderTrace],
                                       minilm: attnscope.Model) -> None:
    _, tr = t5
    plain = attnscope.trace("a short text", model=minilm)
    cases = [(lambda: walkthrough(plain, attention="cross"), "leave attention out"),
             (lambda: walkthrough(tr, attention="self"), "use encoder, decoder or cross"),
             (lambda: walkthrough(tr.cross, attention="encoder"), "pass the whole EncoderDecoderTrace"),
             (lambda: walkthrough(tr, attention="cross", model=minilm), "not a known encoder-decoder model")]
    for call, words in cases:
        with pytest.raises(AttnscopeError) as err:
            call()
        assert words in str(err.value) and "\n" not in str(err.value)


def test_cli_explain_source_target_attention(t5_dir: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["explain", SOURCE, "--target", TARGET, "--model", t5_dir, "--attention", "encoder", "--layer", "1",
                 "--head", "2", "--format", "json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0 and data["attention"] == "encoder" and data["check"]["ok"]
    assert "position_bias" in [s["stage"] for s in data["steps"]]
    code = main(["explain", SOURCE, "--target", TARGET, "--model", t5_dir, "--format", "markdown"])
    out = capsys.readouterr().out
    assert code == 0 and "cross-attention (target -> source), layer 0, head 0" in out and "the default" in out
    code = main(["explain", SOURCE, "--model", t5_dir, "--max-new-tokens", "3", "--format", "json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0 and len(data["tokens"]) == 3 and "generated the target" in data["steps"][0]["text"]


def test_cli_attention_or_target_on_another_model_is_one_line(capsys: pytest.CaptureFixture[str],
                                                              tmp_path: Path) -> None:
    for flags, words in ((["--attention", "cross"], "--attention is for encoder-decoder models"),
                         (["--target", "x"], "--target is for encoder-decoder models")):
        code = main(["explain", "a short text", *flags])
        err = capsys.readouterr().err
        assert code == 2 and words in err and len(err.strip().splitlines()) == 1


def test_a_saved_trace_explains_without_the_model(t5: tuple[attnscope.Model, attnscope.EncoderDecoderTrace],
                                                  tmp_path: Path) -> None:
    _, tr = t5
    tr.save(tmp_path / "t5.safetensors")
    loaded = attnscope.EncoderDecoderTrace.load(tmp_path / "t5.safetensors")
    cross = _steps(walkthrough(loaded, layer=1, head=0))
    assert "projections" not in cross and np.array_equal(cross["memory"].arrays["memory"], tr.cross.arrays["memory"])
    assert np.array_equal(cross["weights"].arrays["weights"], tr.cross.weights[1, 0])
    bias = _steps(walkthrough(loaded, layer=1, head=0, attention="decoder"))["position_bias"].arrays
    assert "bucket" not in bias  # the buckets need the model's config; the bias added is the trace's own
    assert np.array_equal(bias["position_bias"], tr.decoder.arrays["position_bias"][1, 0])
