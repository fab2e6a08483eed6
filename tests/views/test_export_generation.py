"""Figures of the generation view: one step as a standalone SVG (every token a <text>, shaded by the step's attention),
PNG and from `attnscope generate ... -o fig.svg`; the page's download buttons; bad figure options one line, exit 2."""

from __future__ import annotations

import re
import struct
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch
import transformers as T

import attnscope
from attnscope.cli.main import main
from attnscope.records.generation import GenerationTrace
from attnscope.tracing.decoding import generate
from attnscope.views.generation import generation_figure

NS = "{http://www.w3.org/2000/svg}"
PROMPT = "time flies like an arrow & <fruit>"


@pytest.fixture(scope="module")
def lm(minilm: attnscope.Model) -> attnscope.Model:
    """A random-weight GPT-2 LM with the bundled tokenizer (real model code, real generate loop)."""
    torch.manual_seed(0)
    model = T.GPT2LMHeadModel(T.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=30522, bos_token_id=101,
                                           eos_token_id=None))
    model.config._attn_implementation = "eager"
    return attnscope.load_model(model.eval(), tokenizer=minilm.tokenizer)


@pytest.fixture(scope="module")
def generation(lm: attnscope.Model) -> GenerationTrace:
    return generate(PROMPT, model=lm, max_new_tokens=5)


def group(root: ET.Element, name: str) -> ET.Element:
    return next(e for e in root.iter(f"{NS}g") if e.get("class") == name)


def test_step_figure_has_every_token_as_text_shaded_by_the_weights(generation: GenerationTrace,
                                                                   tmp_path: Path) -> None:
    g = generation
    out = generation_figure(g, tmp_path / "step.svg", step=2, layer=1, head=3)
    root = ET.fromstring(out.read_bytes())
    assert root.tag == f"{NS}svg" and not list(root.iter(f"{NS}script"))
    pos = g.steps[2].position
    texts = [t.text for t in group(root, "tokens").iter(f"{NS}text")]
    # every token so far as it reads, the one step 2 writes last: each piece as the tokenizer decodes it alone, the
    # prompt's and each step's alike (WordPiece: a word as the prompt's "flies", without the space the output adds)
    shown = [t.shown for t in g.prompt_tokens] + [s.shown for s in g.steps]
    assert texts == [t.replace("\n", "↵") for t in shown[: pos + 1]]
    assert {"<", "&", ">"} <= set(texts)  # markup characters stay text
    weights = g.step_weights(2)[1, 3]  # [key]: the step's query over positions 0..pos-1
    shades = [float(r.get("fill-opacity", "0")) for r in group(root, "tokens").iter(f"{NS}rect")]
    expected = 0.08 + 0.8 * weights / weights.max()
    assert len(shades) == pos + 1 and shades[-1] == 0  # the token written is not attended to: not shaded
    assert max(abs(s - e) for s, e in zip(shades[:-1], expected, strict=True)) <= 0.8 / 65535 + 5e-4
    bar = group(root, "colourbar")  # what the shades mean: #08519c at opacity 0.08 (0) to 0.88 (the max)
    top = next(t.text or "" for t in bar.iter(f"{NS}text") if t.get("class") == "max")
    assert top.endswith("(max)") and float(top.split()[0]) == pytest.approx(float(weights.max()), abs=5e-5)
    bands = [r.get("fill") for r in bar.iter(f"{NS}rect") if r.get("fill") != "none"]
    blend = ["#" + "".join(f"{round(255 + (c - 255) * a):02x}" for c in (8, 81, 156)) for a in (0.88, 0.08)]
    assert [bands[0], bands[-1]] == blend
    caption = " · ".join(t.text or "" for t in group(root, "caption").iter(f"{NS}text"))  # lines wrap at " · "
    assert f"generation view · step 2 writes position {pos} · layer 1 · head 3 · 0-indexed" in caption
    assert re.search(r"verified: every step recomputed with its KV cache .* max error \d\.\de-\d\d", caption), caption
    alternatives = [t.text for t in group(root, "alternatives").iter(f"{NS}text")]
    assert alternatives[2::2] == [f"{a.probability:.4f}" for a in g.steps[2].alternatives]


def test_cli_writes_the_generation_figure_and_refuses_bad_options(
        lm: attnscope.Model, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model_dir = tmp_path / "gpt2-lm"
    lm.model.save_pretrained(model_dir)
    lm.tokenizer.save_pretrained(model_dir)
    png = tmp_path / "fig.png"
    code = main(["generate", "time flies", "--model", str(model_dir), "--max-new-tokens", "3", "--format", "json",
                 "--step", "1", "--head", "2", "--scale", "3", "-o", str(png)])
    assert code == 0 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">I", png.read_bytes()[16:20])[0] % 3 == 0  # 3 pixels per SVG pixel
    for args, message in [
        (["-o", "fig.gif"], "unsupported output format 'gif': name the output FILE.safetensors or FILE.npz"),
        (["--step", "7", "-o", "fig.svg"], "--step 7 is outside the 3 steps of --max-new-tokens (0-indexed)"),
        (["--scale", "0", "-o", "fig.png"], "--scale must be above 0 and at most 8, got 0"),
        (["--step", "1", "-o", "g.npz"], "--step chooses the step of a figure: name the output FILE.svg"),
    ]:
        capsys.readouterr()
        code = main(["generate", "time flies", "--model", str(model_dir), "--max-new-tokens", "3", *args])
        out, err = capsys.readouterr()
        assert code == 2 and out == "" and err.startswith(f"attnscope: error: {message}") and err.count("\n") == 1


def test_page_download_buttons(generation: GenerationTrace, tmp_path: Path) -> None:
    from attnscope.views.browser import chromium

    page_file = tmp_path / "generation.html"
    generation.show().save(page_file)
    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1100, "height": 800})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(page_file.as_uri())
        page.wait_for_selector(".as-gen-tok")
        page.select_option("select[aria-label^=layer]", "0")
        with page.expect_download() as got:
            page.click(".as-export[data-format=svg]")
        download = got.value
        assert download.suggested_filename == f"attnscope-generation-step{generation.n_steps - 1}-layer0-headmean.svg"
        root = ET.fromstring(Path(download.path()).read_bytes())
        caption = " · ".join(t.text or "" for t in group(root, "caption").iter(f"{NS}text"))  # lines wrap at " · "
        assert "layer 0 · mean over heads" in caption
        with page.expect_download() as got:
            page.click(".as-export[data-format=png]")
        assert Path(got.value.path()).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert errors == []


def test_step_figure_without_its_caption(generation: GenerationTrace, tmp_path: Path) -> None:
    kept = ET.fromstring(generation_figure(generation, tmp_path / "kept.svg", step=1, layer=0).read_bytes())
    dropped = ET.fromstring(generation_figure(generation, tmp_path / "bare.svg", step=1, layer=0,
                                              caption=False).read_bytes())
    assert [e for e in kept.iter(f"{NS}g") if e.get("class") == "caption"]
    assert not [e for e in dropped.iter(f"{NS}g") if e.get("class") == "caption"]
    assert "generation view" not in " ".join(t.text or "" for t in dropped.iter(f"{NS}text"))
    tokens = [t.text for t in group(dropped, "tokens").iter(f"{NS}text")]
    assert tokens == [t.text for t in group(kept, "tokens").iter(f"{NS}text")] and tokens  # the same step drawn
    assert float(dropped.get("height", "0")) < float(kept.get("height", "0"))
