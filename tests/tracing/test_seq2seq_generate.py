"""generate on encoder-decoder models: the translation step by step, each new token's cross-attention over the
source (the alignment), every step's rows from the model's own generate loop compared with the verified trace.

Random-weight T5 and Marian with the bundled MiniLM tokenizer (tests/support/seq2seq.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

import attnscope
from attnscope.cli.main import main
from attnscope.errors import AttnscopeError
from attnscope.records.translation import Seq2SeqGeneration
from attnscope.tracing.seq2seq_decoding import generate_seq2seq
from tests.support.seq2seq import tiny_seq2seq

SOURCE = "the cat sat on the mat"


@pytest.fixture(scope="module")
def generated(minilm: attnscope.Model) -> Callable[[str], tuple[attnscope.Model, Seq2SeqGeneration]]:
    cache: dict[str, tuple[attnscope.Model, Seq2SeqGeneration]] = {}

    def get(family: str) -> tuple[attnscope.Model, Seq2SeqGeneration]:
        if family not in cache:
            m = tiny_seq2seq(family, minilm)
            cache[family] = m, generate_seq2seq(SOURCE, model=m, max_new_tokens=5)
        return cache[family]

    return get


@pytest.mark.parametrize("family", ["t5", "marian"])
def test_steps_are_the_models_greedy_output_and_every_step_is_verified(
        family: str, generated: Callable[[str], tuple[attnscope.Model, Seq2SeqGeneration]]) -> None:
    m, g = generated(family)
    ids = m.tokenizer(SOURCE, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        out = m.model.generate(input_ids=ids, max_new_tokens=5, do_sample=False, num_beams=1, output_scores=True,
                               return_dict_in_generate=True)
    written = out.sequences[0, 1:].tolist()
    assert [s.id for s in g.steps] == written[: g.n_steps] and g.n_steps == 5 and g.stopped == "max_new_tokens"
    assert [t.id for t in g.trace.decoder.tokens] == out.sequences[0, : g.n_steps].tolist()  # start, then written
    for s in g.steps:  # the probability greedy search maximised
        probs = torch.softmax(out.scores[s.step][0], dim=-1)
        assert s.probability == pytest.approx(float(probs[s.id]), abs=1e-6) and s.id == int(probs.argmax())
    assert g.status() == "PASS" and g.trace.generated
    for kind, report in g.check().items():
        loop = report.worst("weights", "generate")
        assert loop is not None and loop <= 1e-5, kind  # the generate loop's rows (KV cache) = the trace's rows
        assert report.worst("weights", "recompute") is not None and report.verified


def test_alignment_is_each_steps_cross_attention_row(
        generated: Callable[[str], tuple[attnscope.Model, Seq2SeqGeneration]]) -> None:
    _, g = generated("t5")
    src = g.trace.encoder.n_tokens
    for s in range(g.n_steps):
        a = g.alignment(s)  # [layer, head, source]
        assert a.shape == (2, 4, src) and np.array_equal(a, g.trace.cross.weights[:, :, s, :])
        np.testing.assert_allclose(a.sum(-1), 1.0, atol=1e-5)
        top = g.aligned(s, layer=1, head=None, k=3)
        mean = a[1].mean(axis=0)
        assert [i for i, _ in top] == list(np.argsort(-mean, kind="stable")[:3])
        assert top[0][1] == pytest.approx(float(mean.max()))
    with pytest.raises(AttnscopeError, match="step 5 is out of range"):
        g.alignment(5)


def test_saved_generation_loads_as_an_encoder_decoder_trace(
        generated: Callable[[str], tuple[attnscope.Model, Seq2SeqGeneration]], tmp_path: Path) -> None:
    _, g = generated("marian")
    path = tmp_path / "g.safetensors"
    g.save(path)
    back = attnscope.EncoderDecoderTrace.load(path)
    assert back.generated and back.target_text == g.completion
    assert np.array_equal(back.cross.weights, g.trace.cross.weights)
    assert back.cross.check().worst("weights", "generate") == g.trace.cross.check().worst("weights", "generate")


Generated = Callable[[str], tuple[attnscope.Model, Seq2SeqGeneration]]


def test_bad_input_is_one_line(minilm: attnscope.Model, generated: Generated) -> None:
    m, _ = generated("t5")
    cases = [(lambda: generate_seq2seq(SOURCE, model=minilm), "not an encoder-decoder model"),
             (lambda: generate_seq2seq("  ", model=m), "source"),
             (lambda: generate_seq2seq(SOURCE, model=m, max_new_tokens=0), "max_new_tokens 0 is out of range"),
             (lambda: attnscope.generate(SOURCE, model=m), "is an encoder-decoder model: it writes a target")]
    for call, words in cases:
        with pytest.raises(AttnscopeError) as err:
            call()
        assert words in str(err.value) and "\n" not in str(err.value)


def test_cli_generate_on_an_encoder_decoder(t5_dir: str, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code = main(["generate", SOURCE, "--model", t5_dir, "--max-new-tokens", "3", "--head", "1", "--format", "json",
                 "-o", str(tmp_path / "g.npz")])
    data = json.loads(capsys.readouterr().out)
    assert code == 0 and data["status"] == "PASS" and len(data["steps"]) == 3
    assert data["source_tokens"][1] == "the" and data["aligned_by"] == {"layer": 1, "head": 1}
    first = data["steps"][0]
    assert len(first["alignment"]) == 4 and len(first["alignment"][1]) == len(data["source_tokens"])
    assert first["aligned"][0]["weight"] == pytest.approx(max(first["alignment"][1]))
    assert attnscope.EncoderDecoderTrace.load(tmp_path / "g.npz").generated
    code = main(["generate", SOURCE, "--model", t5_dir, "--max-new-tokens", "2", "--html", str(tmp_path / "g.html")])
    out = " ".join(capsys.readouterr().out.split())
    assert code == 0 and "the alignment; cross-attention of layer 1, mean over heads" in out
    assert "generate loop's rows vs the trace" in out
    assert 'id="attnscope-translation"' in (tmp_path / "g.html").read_text()  # the translation view
    for flags, words in ((["--temperature", "0.7"], "--temperature: generation on an encoder-decoder"),
                         (["-o", str(tmp_path / "f.svg")], "figures of an encoder-decoder generation"),
                         (["--step", "1"], "is an encoder-decoder model: it writes a target")):
        code = main(["explain" if "--step" in flags else "generate", SOURCE, "--model", t5_dir, *flags])
        err = capsys.readouterr().err
        assert code == 2 and words in err and len(err.strip().splitlines()) == 1


def test_public_api() -> None:
    assert attnscope.generate_seq2seq is generate_seq2seq and attnscope.Seq2SeqGeneration is Seq2SeqGeneration


def test_translation_view_shades_the_source_by_each_steps_alignment(
        generated: Callable[[str], tuple[attnscope.Model, Seq2SeqGeneration]], tmp_path: Path) -> None:
    """The page in headless Chromium: the source's shading is the step's alignment (mean over heads of the last
    layer, then one head), the target grows with the slider, nothing is fetched, no error."""
    from attnscope.views.browser import chromium

    _, g = generated("marian")
    page_file = tmp_path / "translation.html"
    page_file.write_text(g.to_html(), encoding="utf-8")
    errors: list[str] = []
    requests: list[str] = []
    with chromium() as browser:
        page = browser.new_page()
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("console", lambda m: m.type == "error" and errors.append(m.text))
        page.on("request", lambda r: requests.append(r.url))
        page.goto(page_file.as_uri())
        page.wait_for_selector("[data-attnscope-ready]")
        weights = "() => [...document.querySelectorAll('.as-tr-source .as-tr-tok')].map(t => Number(t.dataset.weight))"
        shown = page.evaluate(weights)
        np.testing.assert_allclose(shown, g.alignment(g.n_steps - 1)[1].mean(axis=0), atol=2e-5)  # uint16 + mean
        page.fill('input[aria-label="step (0-indexed)"]', "1")
        page.dispatch_event('input[aria-label="step (0-indexed)"]', "input")
        page.select_option('select[aria-label="head (0-indexed)"]', "2")
        np.testing.assert_allclose(page.evaluate(weights), g.alignment(1)[1, 2], atol=1e-5)
        target = page.eval_on_selector_all(".as-tr-target .as-tr-tok", "ts => ts.map(t => t.textContent)")
        assert target == [s.shown.replace("\n", "↵") for s in g.steps[:2]]  # as the tokenizer decodes each piece
        source = page.eval_on_selector_all(".as-tr-source .as-tr-tok", "ts => ts.map(t => t.textContent)")
        assert source == [t.shown.replace("\n", "↵") for t in g.trace.cross.keys]
        assert page.inner_text(".as-tr-badge").startswith("check: PASS")
        assert page.eval_on_selector_all(".as-tr-grid tr", "rs => rs.length") == g.n_steps + 1
        page.click(".as-tr-controls button")  # play on from step 1 (data.js's stepPlayer), to the last step
        page.wait_for_function("(last) => document.querySelector('input[aria-label=\"step (0-indexed)\"]').value"
                               " === last", arg=str(g.n_steps - 1), timeout=10_000)
        page.wait_for_function("() => document.querySelector('.as-tr-controls button').textContent === '▶ play'",
                               timeout=10_000)  # and it stops there
    assert not errors, errors
    assert all(u.startswith("file:") for u in requests), requests
