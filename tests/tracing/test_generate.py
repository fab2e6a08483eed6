"""Generation: traced inside the real model.generate loop, every step verified (tiny random-weight decoders)."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers as T

import attnscope
from attnscope.errors import AttnscopeError
from attnscope.records.check_report import TOLERANCE
from attnscope.records.generation import GeneratedToken, GenerationTrace, load_generation
from attnscope.tracing.decoding import (
    GenerationInterrupted,
    StepRecorder,
    generate,
    per_layer,
    recording_steps,
)
from attnscope.verify.decoding import verify_generation
from tests.support.cli import saved

PROMPT = "time flies like an arrow"


def _causal_lm(name: str) -> T.PreTrainedModel:
    torch.manual_seed(0)
    if name == "gpt2":
        model: T.PreTrainedModel = T.GPT2LMHeadModel(T.GPT2Config(
            n_embd=64, n_layer=2, n_head=4, vocab_size=30522, bos_token_id=101, eos_token_id=None))
    else:
        model = T.LlamaForCausalLM(T.LlamaConfig(
            hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=128, vocab_size=30522, bos_token_id=101, eos_token_id=None))
    model.config._attn_implementation = "eager"
    model.eval()  # type: ignore[no-untyped-call]
    return model


@pytest.fixture(scope="session")
def decoder(minilm: attnscope.Model) -> Callable[[str], attnscope.Model]:
    """decoder("gpt2") or decoder("llama"): a random-weight causal LM with its head, the bundled tokenizer."""
    cache: dict[str, attnscope.Model] = {}

    def get(name: str) -> attnscope.Model:
        if name not in cache:
            cache[name] = attnscope.load_model(_causal_lm(name), tokenizer=minilm.tokenizer)
        return cache[name]

    return get


@pytest.fixture(scope="session")
def gpt2_generation(decoder: Callable[[str], attnscope.Model]) -> GenerationTrace:
    return generate(PROMPT, model=decoder("gpt2"), max_new_tokens=8)


def _plain_generate(m: attnscope.Model, n: int, **kwargs: object) -> list[int]:
    enc = m.tokenizer(PROMPT, return_tensors="pt")
    with torch.no_grad():
        out = m.model.generate(  # type: ignore[operator]
            input_ids=enc["input_ids"], attention_mask=enc["attention_mask"],
                               max_new_tokens=n, pad_token_id=0, **kwargs)
    return [int(i) for i in out[0]]


def test_greedy_equals_model_generate(decoder: Callable[[str], attnscope.Model],
                                      gpt2_generation: GenerationTrace) -> None:
    expected = _plain_generate(decoder("gpt2"), 8, do_sample=False)
    assert [t.id for t in gpt2_generation.tokens] == expected
    assert gpt2_generation.stopped == "max_new_tokens"


def test_stops_at_end_of_sequence(decoder: Callable[[str], attnscope.Model],
                                  gpt2_generation: GenerationTrace) -> None:
    m = decoder("gpt2")
    eos = next(s.id for s in gpt2_generation.steps if s.id != gpt2_generation.steps[0].id)  # a later token
    m.model.generation_config.eos_token_id = eos
    try:
        g = generate(PROMPT, model=m, max_new_tokens=8)
        expected = _plain_generate(m, 8, do_sample=False)
    finally:
        m.model.generation_config.eos_token_id = None
    assert g.stopped == "eos" and g.steps[-1].id == eos and g.n_steps < 8
    assert [t.id for t in g.tokens] == expected
    assert g.check().ok


def test_sampling_with_seed_equals_model_generate(decoder: Callable[[str], attnscope.Model]) -> None:
    m = decoder("gpt2")
    g = generate(PROMPT, model=m, max_new_tokens=6, temperature=0.7, top_k=50, seed=3, verify=False)
    torch.manual_seed(3)
    expected = _plain_generate(m, 6, do_sample=True, temperature=0.7, top_k=50, top_p=1.0)
    assert [t.id for t in g.tokens] == expected
    again = generate(PROMPT, model=m, max_new_tokens=6, temperature=0.7, top_k=50, seed=3, verify=False)
    assert [s.id for s in again.steps] == [s.id for s in g.steps]


def test_every_step_verified_both_ways(gpt2_generation: GenerationTrace) -> None:
    report = gpt2_generation.check()
    assert report.ok, report.to_dict()
    sources = {(c.stage, c.source) for c in report.comparisons}
    for stage in ("q", "k", "v", "weights", "context", "output"):
        assert (stage, "recompute") in sources and (stage, "no-cache") in sources
    assert ("x", "no-cache") in sources
    assert report.max_error <= TOLERANCE


def test_steps_rows_and_probabilities(gpt2_generation: GenerationTrace) -> None:
    g = gpt2_generation
    assert g.trace.n_tokens == g.prompt_length + g.n_steps - 1  # the last token is never read back
    for s in g.steps:
        w = g.step_weights(s.step)  # [layer, head, key]
        assert w.shape[-1] == g.prompt_length + s.step
        np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-5)
        assert s.alternatives[0].probability >= s.probability - 1e-7  # greedy picks the most likely
        assert s.id == s.alternatives[0].id
    with pytest.raises(AttnscopeError, match="step 8 is out of range"):
        g.step_weights(8)


def _record_steps(m: attnscope.Model, max_new_tokens: int, rows: int) -> tuple[StepRecorder, torch.Tensor, int]:
    """The model's own greedy generate inside recording_steps: the recorder (sized for `rows` positions), the ids
    written (prompt included) and the prompt's length."""
    enc = m.tokenizer(PROMPT, return_tensors="pt")
    n_prompt = int(enc["input_ids"].shape[1])
    recorder = StepRecorder(2, n_prompt + rows)
    with torch.no_grad(), recording_steps(m.model, recorder):
        out = m.model.generate(  # type: ignore[operator]
            input_ids=enc["input_ids"], attention_mask=enc["attention_mask"],
            max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=0)
    return recorder, out, n_prompt


def test_check_can_fail(decoder: Callable[[str], attnscope.Model]) -> None:
    m = decoder("gpt2")
    recorder, out, n_prompt = _record_steps(m, 4, 3)
    layers = per_layer(recorder.cut(n_prompt + 3))
    layers["context"][1][0, 2, n_prompt + 1, 0] += 1e-3  # one number of step 2's context, layer 1, head 2
    comparisons, unsupported = verify_generation(m, layers, out[:, : n_prompt + 3], n_prompt, 4)
    assert unsupported is None
    bad = {(c.stage, c.source): c.errors for c in comparisons if c.max_error > TOLERANCE}
    assert set(bad) == {("context", "recompute"), ("context", "no-cache")}
    assert bad[("context", "recompute")][1, 2] == pytest.approx(1e-3, rel=1e-2)
    assert bad[("context", "recompute")][0].max() <= TOLERANCE


def test_trace_keeps_rows_not_cache_copies(decoder: Callable[[str], attnscope.Model]) -> None:
    recorder, _, n_prompt = _record_steps(decoder("gpt2"), 10, 9)
    assert recorder.steps() == 10  # 10 forward passes: the prompt, then one new row each
    held = [v for v in vars(recorder).values() if isinstance(v, torch.Tensor | list)]
    assert not held  # no tensor of any step is held, only the arrays the rows were written into
    assert recorder.arrays["k"].shape == (2, 4, n_prompt + 9, 16)


def test_llama_generation_verified(decoder: Callable[[str], attnscope.Model]) -> None:
    m = decoder("llama")
    g = generate(PROMPT, model=m, max_new_tokens=5)
    assert [t.id for t in g.tokens] == _plain_generate(m, 5, do_sample=False)
    report = g.check()
    assert report.ok, report.to_dict()
    # k and v are kept per k/v head (4 query heads share 2), not repeated; their errors count per query head
    n = g.prompt_length + 4
    assert g.trace.arrays["k"].shape == g.trace.arrays["v"].shape == (2, 2, n, 16)
    assert g.trace.kv_heads == g.model["kv_heads"] == 2 and g.trace.kv_head(3) == 1
    kv = [c for c in report.comparisons if c.stage in ("k", "v")]
    assert {c.source for c in kv} == {"recompute", "no-cache"} and all(c.errors.shape == (2, 4) for c in kv)
    np.testing.assert_allclose(g.trace.arrays["scores"], g.trace.arrays["q"] @ np.repeat(
        g.trace.arrays["k"], 2, axis=1).transpose(0, 1, 3, 2), atol=TOLERANCE, rtol=0)


def test_grouped_kv_check_can_fail(decoder: Callable[[str], attnscope.Model]) -> None:
    """One number of k/v head 1's cache changed: the error shows for query heads 2 and 3, which read it."""
    m = decoder("llama")
    recorder, out, n_prompt = _record_steps(m, 4, 3)
    layers = per_layer(recorder.cut(n_prompt + 3))
    assert layers["k"][0].shape[1] == 2  # per k/v head
    layers["k"][0][0, 1, n_prompt + 1, 0] += 1e-3  # layer 0, k/v head 1, step 2's new key
    comparisons, _ = verify_generation(m, layers, out[:, : n_prompt + 3], n_prompt, 4)
    errors = {(c.stage, c.source): c.errors for c in comparisons}
    for source in ("recompute", "no-cache"):
        k = errors[("k", source)]  # [layer, head]
        assert k[0, 2] > TOLERANCE and k[0, 3] > TOLERANCE, source
        assert k[0, :2].max() <= TOLERANCE and k[1].max() <= TOLERANCE, source


def test_explained_step_shows_the_cache_of_the_kv_head_read(decoder: Callable[[str], attnscope.Model]) -> None:
    """`explain --step`'s cache step for a grouped-query head shows its k/v head's keys and values (head 3 of 4
    reads k/v head 1 of 2): indexing k by the query head ran past the k/v heads."""
    from attnscope.cli.generate import cache_step

    g = generate(PROMPT, model=decoder("llama"), max_new_tokens=3)
    pos = g.query_position(2)
    step = cache_step(g, 2, 1, 3)
    np.testing.assert_array_equal(step.arrays["k (cache + new)"], g.trace.arrays["k"][1, 1, : pos + 1])
    np.testing.assert_array_equal(step.arrays["v (cache + new)"], g.trace.arrays["v"][1, 1, : pos + 1])
    assert step.title.endswith("k/v head 1 (read by head 3)") and "head 3 reads k/v head 1's" in step.text


def test_generation_saved_with_kv_per_query_head_still_explained(decoder: Callable[[str], attnscope.Model],
                                                                 tmp_path: Path) -> None:
    """Files written before k and v were kept per k/v head hold them per query head (copies of their k/v head):
    they load, and explaining a step reads the same numbers."""
    from safetensors import safe_open
    from safetensors.numpy import load_file, save_file

    from attnscope.explain.from_trace import walkthrough

    m = decoder("llama")
    g = generate(PROMPT, model=m, max_new_tokens=2)
    old = tmp_path / "old.safetensors"
    g.save(old)
    with safe_open(str(old), "np") as f:
        meta = f.metadata()
    arrays = load_file(str(old))
    for stage in ("k", "v"):
        arrays[stage] = np.repeat(arrays[stage], 2, axis=1)  # what the old recorder kept
    save_file(arrays, str(old), metadata=meta)
    loaded = load_generation(old)
    assert loaded.trace.kv_heads == 4
    new, was = walkthrough(g.step_trace(0), 1, 3, model=m), walkthrough(loaded.step_trace(0), 1, 3, model=m)
    for a, b in zip(new.steps, was.steps, strict=True):
        assert a.text == b.text, a.stage
        for name in a.arrays:
            np.testing.assert_allclose(a.arrays[name], b.arrays[name], atol=TOLERANCE, rtol=0, err_msg=name)


@pytest.mark.parametrize("head", [1, 3])  # query heads of k/v heads 0 and 1 (4 heads share 2)
def test_step_walkthrough_of_grouped_heads_matches_the_trace(decoder: Callable[[str], attnscope.Model],
                                                             head: int) -> None:
    """A step walkthrough of a grouped-query head reads its k/v head for W_K, W_V, the rotation, k and v, and
    shows what explaining the prompt's trace shows."""
    from attnscope.explain.from_trace import walkthrough

    m = decoder("llama")
    g = generate(PROMPT, model=m, max_new_tokens=2)
    stepped = walkthrough(g.step_trace(0), 1, head, model=m)
    plain = walkthrough(attnscope.trace(PROMPT, model=m), 1, head, model=m)
    mine = {s.stage: s for s in stepped.steps}
    for want in plain.steps:
        if want.stage in ("projections", "q_pre", "k", "v"):
            got = mine[want.stage]
            assert got.text == want.text and list(got.arrays) == list(want.arrays), want.stage
            for name, array in want.arrays.items():
                np.testing.assert_allclose(got.arrays[name], array, atol=TOLERANCE, rtol=0, err_msg=name)
    assert f"head {head} reads k/v head {head // 2}" in mine["k"].text


def test_smollm2_greedy_equals_model_generate_and_every_step_verified(smollm2: attnscope.Model) -> None:
    g = generate("The capital of France is", model=smollm2, max_new_tokens=6)
    enc = smollm2.tokenizer("The capital of France is", return_tensors="pt")
    with torch.no_grad():
        expected = smollm2.model.generate(  # type: ignore[operator]
            input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], max_new_tokens=6, do_sample=False)
    assert [t.id for t in g.tokens] == [int(i) for i in expected[0]]
    assert g.completion.startswith(" Paris")
    report = g.check()
    assert report.ok and report.tolerance == TOLERANCE, report.to_dict()
    assert {c.source for c in report.comparisons} == {"recompute", "no-cache"}


def test_interrupt_keeps_steps(decoder: Callable[[str], attnscope.Model]) -> None:
    def stop_at_third(step: GeneratedToken) -> None:
        if step.step == 2:
            raise KeyboardInterrupt

    with pytest.raises(GenerationInterrupted) as info:
        generate(PROMPT, model=decoder("gpt2"), max_new_tokens=8, on_token=stop_at_third)
    partial = info.value.partial
    assert partial is not None and partial.stopped == "interrupted" and partial.n_steps == 3
    assert partial.check().ok


def test_save_and_load(gpt2_generation: GenerationTrace, tmp_path: Path) -> None:
    for name in ("gen.safetensors", "gen.npz"):
        gpt2_generation.save(tmp_path / name)
        back = load_generation(tmp_path / name)
        assert [s.to_dict() for s in back.steps] == [s.to_dict() for s in gpt2_generation.steps]
        assert back.completion == gpt2_generation.completion
        np.testing.assert_array_equal(back.trace.weights, gpt2_generation.trace.weights)
        assert back.check().ok and back.check().max_error == gpt2_generation.check().max_error
        assert attnscope.Trace.load(tmp_path / name).n_tokens == gpt2_generation.trace.n_tokens


def test_loading_a_plain_trace_says_so(tiny_model: Callable[[str], attnscope.Model], tmp_path: Path) -> None:
    attnscope.trace(PROMPT, model=tiny_model("gpt2")).save(tmp_path / "t.npz")
    with pytest.raises(AttnscopeError, match="holds a trace, not a generation"):
        load_generation(tmp_path / "t.npz")


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"prompt": "  "}, "prompt is empty"),
    ({"max_new_tokens": 0}, "max_new_tokens 0 is out of range"),
    ({"max_new_tokens": 5000}, "max_new_tokens 5000 is out of range"),
    ({"temperature": 0.0}, "temperature 0.0 is out of range"),
    ({"temperature": float("inf")}, "temperature inf is out of range: use a finite number from 0.0001"),
    ({"top_p": 1.5}, "top_p 1.5 is out of range"),
])
def test_bad_settings(decoder: Callable[[str], attnscope.Model], kwargs: dict[str, object], message: str) -> None:
    args: dict[str, object] = {"prompt": PROMPT, "model": decoder("gpt2"), **kwargs}
    with pytest.raises(AttnscopeError, match=message):
        generate(**args)  # type: ignore[arg-type]


def test_encoders_and_headless_models_refused(tiny_model: Callable[[str], attnscope.Model]) -> None:
    with pytest.raises(AttnscopeError, match="is an encoder and cannot generate"):
        generate(PROMPT, model=tiny_model("bert"))
    with pytest.raises(AttnscopeError, match="has no language-modeling head"):
        generate(PROMPT, model=tiny_model("gpt2"))


def test_max_new_tokens_bounded_by_positions(decoder: Callable[[str], attnscope.Model]) -> None:
    with pytest.raises(AttnscopeError, match="use at most 1017"):
        generate(PROMPT, model=decoder("gpt2"), max_new_tokens=1020)


def test_generation_record_is_torch_free() -> None:
    probe = "import attnscope.records.generation, sys; print(any(m in sys.modules for m in ('torch', 'transformers')))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "False", done.stderr


def test_public_api() -> None:
    assert callable(attnscope.generate) and attnscope.generate is generate
    assert attnscope.GenerationTrace is GenerationTrace


# --- the CLI: attnscope generate, explain --step ---

@pytest.fixture(scope="session")
def gpt2_dir(decoder: Callable[[str], attnscope.Model], tmp_path_factory: pytest.TempPathFactory) -> str:
    """The random-weight GPT-2 LM saved as a local checkpoint, for --model."""
    return saved(decoder("gpt2"), tmp_path_factory, "gpt2-lm")


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    from attnscope.cli.main import main

    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_generate_streams_then_tables(gpt2_dir: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    html = tmp_path / "g.html"
    code, out, err = _cli(["generate", PROMPT, "--model", gpt2_dir, "--max-new-tokens", "4", "--html", str(html)],
                          capsys)
    assert code == 0, err
    assert 'id="attnscope-generation"' in html.read_text(encoding="utf-8")
    g = generate(PROMPT, model=gpt2_dir, max_new_tokens=4)
    assert out.startswith(PROMPT + g.completion)  # the text streamed first, as it was generated
    assert "most attended" in out and "no-cache" in out and "PASS" in out


def test_cli_generate_json_and_explain_step(gpt2_dir: str, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    saved = tmp_path / "gen.npz"
    code, out, err = _cli(["generate", PROMPT, "--model", gpt2_dir, "--max-new-tokens", "3", "--format", "json",
                           "--layer", "0", "--head", "1", "-o", str(saved)], capsys)
    assert code == 0, err
    data = json.loads(out)
    assert len(data["steps"]) == 3 and data["check"]["ok"] and data["attended_by"] == {"layer": 0, "head": 1}
    g = load_generation(saved)
    first = data["steps"][2]["attended"][0]
    assert first["weight"] == pytest.approx(float(g.step_weights(2)[0, 1].max()))
    code, out, err = _cli(["explain", "--generation", str(saved), "--step", "2", "--model", gpt2_dir,
                           "--layer", "1", "--head", "3", "--format", "markdown"], capsys)
    assert code == 0, err
    assert "KV cache of layer 1, head 3" in out and f"query token {g.query_position(2)}" in out


@pytest.mark.parametrize(("argv", "message"), [
    (["generate", " "], "the prompt is empty"),
    (["generate", PROMPT, "--max-new-tokens", "0"], "--max-new-tokens 0 is out of range"),
    (["generate", PROMPT, "--top-p", "2"], "--top-p 2.0 is out of range"),
    (["generate", PROMPT, "--model", "minilm"], "is an encoder and cannot generate"),
    (["explain", "--generation", "missing.npz", "--step", "0"], "missing.npz"),
])
def test_cli_bad_input_one_line(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _cli(argv, capsys)
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert out == ""  # refused before the prompt streams: the error's line stands alone


@pytest.mark.parametrize(("flag", "value", "message"), [("--layer", "2", "layer 2 is out of range"),
                                                        ("--head", "-1", "head -1 is out of range")])
def test_cli_generate_checks_layer_and_head_before_generating(gpt2_dir: str, flag: str, value: str, message: str,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _cli(["generate", PROMPT, "--model", gpt2_dir, "--max-new-tokens", "2", flag, value], capsys)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert out == ""


class _InterruptingStdout(io.StringIO):
    """A terminal where the user presses Ctrl-C while the third piece of text is being written."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, s: str) -> int:
        self.writes += 1
        if self.writes == 4:  # the prompt, then the pieces of steps 0, 1 and 2
            raise KeyboardInterrupt
        return super().write(s)


def test_cli_ctrl_c_keeps_what_was_generated(gpt2_dir: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    from attnscope.cli.main import main

    terminal = _InterruptingStdout()
    monkeypatch.setattr(sys, "stdout", terminal)
    code = main(["generate", PROMPT, "--model", gpt2_dir, "--max-new-tokens", "20", "-o", str(tmp_path / "g.npz")])
    assert code == 130
    assert "interrupted: keeping the 3 steps generated so far" in capsys.readouterr().err
    assert "PASS" in terminal.getvalue()
    assert load_generation(tmp_path / "g.npz").n_steps == 3


# --- the generation view ---

def test_generation_view_in_a_browser(gpt2_generation: GenerationTrace, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    from attnscope.views.browser import chromium

    g = gpt2_generation
    page_file = tmp_path / "generation.html"
    g.show().save(page_file)
    errors: list[str] = []
    requests: list[str] = []
    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1100, "height": 800})
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("request", lambda r: requests.append(r.url))
        page.goto(page_file.as_uri())
        page.wait_for_selector(".as-gen-tok")
        last = g.steps[-1]
        assert page.locator(".as-gen-tok").count() == last.position + 1  # every token, the new one last
        page.fill(".as-gen-slider", "2")
        page.dispatch_event(".as-gen-slider", "input")
        assert page.locator(".as-gen-tok").count() == g.steps[2].position + 1
        page.select_option("select[aria-label^=layer]", "1")
        page.select_option("select[aria-label^=head]", "3")
        query = page.locator(".as-gen-query").get_attribute("title") or ""
        expected = float(g.step_weights(2)[1, 3, g.query_position(2)])
        assert query == f"position {g.query_position(2)}: weight {expected:.4f}"
        bars = page.locator(".as-gen-bar-value").all_inner_texts()
        assert bars == [f"{a.probability:.4f}" for a in g.steps[2].alternatives]
        page.click(".as-gen-play")
        expect(page.locator(".as-gen-slider")).to_have_value("3", timeout=5000)  # played on from step 2
    assert not errors, errors
    assert all(u.startswith(("file:", "data:")) for u in requests), requests


def test_generation_view_escapes_text(gpt2_generation: GenerationTrace) -> None:
    import dataclasses

    g = dataclasses.replace(gpt2_generation, prompt="</script><img src=x onerror=alert(1)>")
    g.prompt_tokens[0] = dataclasses.replace(g.prompt_tokens[0], text="</script><b>")
    try:
        doc = g.to_html()
    finally:
        g.prompt_tokens[0] = gpt2_generation.trace.tokens[0]
    assert "</script><b>" not in doc and "<img" not in doc and doc.count("</script>") == 2


def test_cli_real_sigint_keeps_what_was_generated(gpt2_dir: str, tmp_path: Path) -> None:
    """A real Ctrl-C (SIGINT) to `attnscope generate` while it writes: exit 130, the steps printed and saved."""
    saved = tmp_path / "g.npz"
    proc = subprocess.Popen([sys.executable, "-m", "attnscope.cli.main", "generate", PROMPT, "--model", gpt2_dir,
                             "--max-new-tokens", "1000", "-o", str(saved)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.stdout is not None
    streamed = ""
    while len(streamed) < len(PROMPT) + 20:  # the prompt, then some generated text
        streamed += proc.stdout.read(1)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err
    kept = load_generation(saved)
    assert 0 < kept.n_steps < 1000 and kept.stopped == "interrupted"
    assert f"keeping the {kept.n_steps} steps generated so far" in err and "Traceback" not in err
    assert f"{kept.n_steps} new (greedy; stopped: interrupted)" in " ".join(out.split()) and "PASS" in out
