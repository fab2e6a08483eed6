"""Views of an encoder-decoder trace: one page with the encoder, decoder and cross-attention (target x source)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import attnscope
from attnscope.errors import AttnscopeError
from attnscope.records.trace import EncoderDecoderTrace
from tests.support.seq2seq_traces import TARGET, bart_trace, t5_trace
from tests.support.views import decode_source, page_payload, unpack


@pytest.fixture(scope="session")
def ed_trace(minilm: attnscope.Model) -> EncoderDecoderTrace:
    """A random-weight BART on an 11-token source and an 8-token target (2 encoder layers x 4 heads, 3 x 2)."""
    return bart_trace(minilm)


def block_arrays(block: dict[str, Any], nq: int, nk: int) -> dict[str, np.ndarray]:
    """A neuron block back to float32: q, context [target, d_head]; k, v [source, d_head]; scores, weights [nq, nk]."""
    f = np.frombuffer(unpack(block["encoding"], block["data"]), dtype="<f4")
    d = block["d_head"]
    shapes = {"q": (nq, d), "context": (nq, d), "k": (nk, d), "v": (nk, d), "scores": (nq, nk), "weights": (nq, nk),
              "position_bias": (nq, nk)}
    out, at = {}, 0
    for stage in block["stages"]:
        size = shapes[stage][0] * shapes[stage][1]
        out[stage] = f[at: at + size].reshape(shapes[stage])
        at += size
    assert at == f.size
    return out


def test_one_page_carries_the_three_kinds(ed_trace: EncoderDecoderTrace) -> None:
    data = page_payload(ed_trace.to_html())
    assert data["attention"] == "encoder" and list(data["kinds"]) == ["encoder", "decoder", "cross"]
    assert data["kinds"]["encoder"] is None  # the page's own payload, not a copy
    kinds = {"encoder": data, "decoder": data["kinds"]["decoder"], "cross": data["kinds"]["cross"]}
    for kind, p in kinds.items():
        trace = ed_trace.attention(kind)
        assert p["attention"] == kind and p["tokens"] == trace.token_strings
        assert p["text"] == ed_trace.source and p["pair"] == TARGET  # the header names both
        w = trace.weights
        assert np.abs(decode_source(p["sources"][0]) - w).max() <= w.max() / 510 + 1e-7
        check = trace.check()  # each kind its own badge: its trace's verification
        assert check.verified and p["check"]["ok"] is True and p["check"]["status"] == "PASS"
        assert p["check"]["max_error"] == check.max_error <= 1e-5
        assert np.asarray(p["check"]["head_errors"]).shape == w.shape[:2]
    cross = kinds["cross"]
    assert cross["sources"][0]["shape"] == [3, 2, 8, 11]  # [layer, head, target, source]
    assert cross["key_tokens"] == [t.text for t in ed_trace.encoder.tokens] and "key_tokens" not in data
    assert kinds["decoder"]["causal"] is True and cross["causal"] is False and data["causal"] is False
    assert cross["attention_label"] == "cross-attention (target -> source)"


def test_cross_neuron_blocks_are_the_traces_numbers(ed_trace: EncoderDecoderTrace) -> None:
    cross = page_payload(ed_trace.to_html("neuron", attention="cross"))
    assert cross["attention"] == "cross" and cross["kinds"]["cross"] is None
    block = next(b for b in cross["neuron"]["blocks"] if (b["layer"], b["head"]) == (2, 1))
    got = block_arrays(block, 8, 11)
    for stage, array in got.items():  # q from the decoder's side, k and v over the source
        kv = stage in ("k", "v")
        np.testing.assert_array_equal(array, ed_trace.cross.arrays[stage][2, ed_trace.cross.kv_head(1) if kv else 1])


def test_the_first_kind_and_its_selection(ed_trace: EncoderDecoderTrace) -> None:
    data = page_payload(ed_trace.to_html("matrix", attention="decoder", layer=2, head=1, query=5))
    assert data["attention"] == "decoder" and data["initial"] == {
        "view": "matrix", "layer": 2, "head": 1, "heads": [0, 1], "query": 5, "source": None, "theme": "auto"}
    encoder = data["kinds"]["encoder"]["initial"]  # the encoder has no layer 2 and 4 heads: its own first ones
    assert (encoder["view"], encoder["layer"], encoder["head"], encoder["query"]) == ("matrix", 0, 1, None)
    assert data["kinds"]["cross"]["initial"]["layer"] == 2
    few = page_payload(ed_trace.to_html("model", layers=[1], heads=[0]))
    assert [few["kinds"][k]["layers"] if few["kinds"][k] else few["layers"] for k in few["kinds"]] == [[1], [1], [1]]


@pytest.mark.parametrize(("options", "message"), [
    ({"attention": "self"}, r"attention 'self' is not on this page: it has encoder, decoder, cross"),
    ({"word_level": True}, "word_level is not available for an encoder-decoder trace"),
    ({"layers": [2]}, r"layer 2 is out of range"),
    ({"view": "graph"}, "unknown view 'graph'"),
])
def test_bad_options_are_one_line(ed_trace: EncoderDecoderTrace, options: dict[str, Any], message: str) -> None:
    with pytest.raises(AttnscopeError, match=message):
        ed_trace.to_html(**options)


def test_attention_of_a_plain_trace_is_refused(ed_trace: EncoderDecoderTrace) -> None:
    assert "attnscope-data" in ed_trace.encoder.to_html(attention="encoder")
    with pytest.raises(AttnscopeError, match=r"attention='cross' is for encoder-decoder traces"):
        ed_trace.encoder.to_html(attention="cross")


def test_notebook_display(ed_trace: EncoderDecoderTrace) -> None:
    frame = ed_trace._repr_html_()
    assert frame.startswith('<div class="attnscope-frame"') and 'sandbox="allow-scripts"' in frame
    with pytest.raises(AttnscopeError, match=r"show\(\) displays in Jupyter"):
        ed_trace.show("head")


def test_tokens_are_escaped(ed_trace: EncoderDecoderTrace) -> None:
    html = ed_trace.to_html()
    assert ed_trace.decoder.token_strings[-3:] == ["<", "script", ">"] and ed_trace.cross.weights.shape == (3, 2, 8, 11)
    data = html.split('id="attnscope-data">', 1)[1].split("</script>", 1)[0]
    assert "<" not in data and ">" not in data  # the JSON block cannot close itself or open a tag
    assert '"\\u003c"' in data and "die katze \\u003cscript\\u003e" in data


def test_t5_position_bias_travels_with_the_neuron_data(minilm: attnscope.Model) -> None:
    """T5: no scaling, a relative position bias added before the softmax: carried exactly, never drawn as a map."""
    ed = t5_trace(minilm)
    data = page_payload(ed.to_html("neuron", attention="decoder", layer=1, head=2))
    assert [s["name"] for s in data["sources"]] == ["weights"]  # the signed bias is not an attention map
    block = next(b for b in data["neuron"]["blocks"] if (b["layer"], b["head"]) == (1, 2))
    assert block["stages"][-1] == "position_bias" and block["scaling"] == 1.0
    got = block_arrays(block, 8, 8)
    np.testing.assert_array_equal(got["position_bias"], ed.decoder.arrays["position_bias"][1, 2])
    cross = data["kinds"]["cross"]["neuron"]["blocks"][0]
    assert "position_bias" not in cross["stages"]  # T5's cross-attention has no position bias


def test_a_saved_trace_renders_without_torch(ed_trace: EncoderDecoderTrace, tmp_path: Path) -> None:
    """Save, then load and draw the three kinds in a fresh interpreter: neither torch nor transformers loads."""
    saved = tmp_path / "ed.safetensors"
    ed_trace.save(saved)
    code = (f"import sys\nfrom attnscope.records.trace import EncoderDecoderTrace\n"
            f"html = EncoderDecoderTrace.load({str(saved)!r}).to_html()\n"
            "print('\"attention\":\"cross\"' in html, 'torch' in sys.modules, 'transformers' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "False", "False"]
