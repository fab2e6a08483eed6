"""POST /api/generate on a real `attnscope serve`: NDJSON lines streamed as the model writes, then the view's
payload; bounded like the other endpoints. A random-weight GPT-2 LM saved as a local checkpoint."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch
import transformers as T

import attnscope
from attnscope.tracing.decoding import generate
from tests.support.serve import ARTIFACTS, Server, start_server

PROMPT = "time flies like an arrow"


@pytest.fixture(scope="module")
def decoder_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    model = T.GPT2LMHeadModel(T.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=30522,
                                           bos_token_id=101, eos_token_id=None))
    path = tmp_path_factory.mktemp("gpt2-lm")
    model.save_pretrained(path)
    attnscope.load_model().tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def gen_server(decoder_dir: Path) -> Iterator[Server]:
    s = start_server("--model", str(decoder_dir), "minilm", "--max-tokens", "32")
    yield s
    assert s.stop() == 0, "".join(s.stderr)[-2000:]
    assert "Traceback" not in "".join(s.stderr), "".join(s.stderr)[-4000:]


def test_generate_streams_each_token_then_the_view(gen_server: Server, decoder_dir: Path) -> None:
    with gen_server.client() as c, c.stream("POST", "/api/generate",
                                            json={"prompt": PROMPT, "max_new_tokens": 5}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("application/x-ndjson")
        events = [json.loads(line) for line in r.iter_lines() if line]
    assert [e["event"] for e in events] == ["start"] + ["token"] * 5 + ["done"]
    expected = generate(PROMPT, model=str(decoder_dir), max_new_tokens=5)
    assert [e["piece"] for e in events[1:6]] == [s.piece for s in expected.steps]
    start, done = events[0], events[-1]
    assert start["prompt_tokens"] == done["prompt_tokens"] == [t.text for t in expected.prompt_tokens]
    assert start["model"] == done["model"]
    assert done["check"]["ok"] and len(done["steps"]) == 5
    assert done["steps"][4]["keys"] == expected.query_position(4) + 1


def test_sampling_with_a_seed_equals_the_api(gen_server: Server, decoder_dir: Path) -> None:
    sampling = {"temperature": 1.5, "top_k": 50, "top_p": 0.9, "seed": 3}
    with gen_server.client() as c:
        r = c.post("/api/generate", json={"prompt": PROMPT, "max_new_tokens": 6, **sampling})
    assert r.status_code == 200, r.text
    events = [json.loads(line) for line in r.text.splitlines() if line]
    expected = generate(PROMPT, model=str(decoder_dir), max_new_tokens=6, **sampling)  # type: ignore[arg-type]
    greedy = generate(PROMPT, model=str(decoder_dir), max_new_tokens=6)
    pieces = [e["piece"] for e in events if e["event"] == "token"]
    assert pieces == [s.piece for s in expected.steps]
    assert pieces != [s.piece for s in greedy.steps]  # it really sampled (random weights: a flat distribution)
    assert events[-1]["settings"] == expected.settings and events[-1]["check"]["ok"]


@pytest.mark.parametrize(("body", "status", "message"), [
    ({"prompt": PROMPT, "max_new_tokens": 65}, 422, "max_new_tokens"),
    ({"prompt": PROMPT, "temperature": 0}, 422, "field 'temperature' must be from 0.0001 to 100.0"),
    ({"prompt": PROMPT, "temperature": True}, 422, "field 'temperature' must be a number"),
    ({"prompt": PROMPT, "top_p": 1.5}, 422, "field 'top_p' must be above 0 and at most 1"),
    ({"prompt": PROMPT, "top_k": 0}, 422, "field 'top_k' must be from 1"),
    ({"prompt": PROMPT, "seed": -1}, 422, "field 'seed' must be from 0"),
    ({"prompt": PROMPT, "model": "minilm"}, 422, "is an encoder and cannot generate"),
    ({"prompt": "word " * 40}, 422, "over this server's limit of 32"),
    ({"prompt": " "}, 422, "field 'prompt' is empty"),
])
def test_generate_refusals_are_one_line(gen_server: Server, body: dict[str, object], status: int,
                                        message: str) -> None:
    r = httpx.post(gen_server.url + "api/generate", json=body, headers=gen_server.auth, timeout=60)
    assert r.status_code == status, r.text
    assert message in r.json()["error"] and "\n" not in r.json()["error"]


# Records, in the page, every step the renderer was handed while the stream was still open.
WATCH = """() => {
  const A = window.attnscope;
  const real = A.renderGeneration;
  window.seen = { live: [], renders: 0, stopAfter: null };
  A.renderGeneration = (element, data) => {
    window.seen.renders += 1;
    const view = real(element, data);
    const add = view.addStep;
    view.addStep = (s) => {
      window.seen.live.push(s.piece);
      add(s);
      if (window.seen.live.length === window.seen.stopAfter) document.getElementById("sv-gen-stop").click();
    };
    return view;
  };
}"""


def test_page_generates_live_and_stops(gen_server: Server, decoder_dir: Path) -> None:
    from attnscope.views.browser import chromium

    expected = generate(PROMPT, model=str(decoder_dir), max_new_tokens=6)
    requests: list[str] = []
    errors: list[str] = []
    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.on("request", lambda r: requests.append(r.url))
        page.on("console", lambda m: m.type in ("error", "warning") and errors.append(m.text))
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(gen_server.url)
        page.wait_for_selector("#sv-gen:not([hidden])")
        page.evaluate(WATCH)
        page.fill("#sv-gen-prompt", PROMPT)
        page.fill("#sv-gen-max", "6")
        page.click("#sv-gen-go")
        page.wait_for_selector("#sv-gen-view[data-state=done]", timeout=60_000)
        seen = page.evaluate("() => window.seen")
        shown = page.evaluate("() => [...document.querySelectorAll('#sv-gen-view .as-gen-tok')]"
                              ".map((t) => t.textContent)")
        status = page.text_content("#sv-gen-status")

        page.evaluate("() => { window.seen.live = []; }")  # sampled, with a seed
        for field, value in (("temperature", "1.5"), ("top-p", "0.9"), ("seed", "3")):
            page.fill(f"#sv-gen-{field}", value)
        page.click("#sv-gen-go")
        page.wait_for_selector("#sv-gen-view[data-state=done]", timeout=60_000)
        sampled = page.evaluate("() => window.seen.live")
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "generate-panel.png"), full_page=True)

        page.evaluate("() => { window.seen.live = []; window.seen.stopAfter = 1; }")  # Stop at the first token
        page.fill("#sv-gen-max", "64")
        page.click("#sv-gen-go")
        page.wait_for_selector("#sv-gen-view[data-state=stopped]", timeout=60_000)
        stopped = page.evaluate("() => window.seen.live")
        stop_status = page.text_content("#sv-gen-status")
        page.close()
    assert seen["live"] == [s.piece for s in expected.steps]  # drawn step by step as the lines arrived
    assert seen["renders"] == 2  # once at "start", once with the rows and the check at "done"
    # each token as the tokenizer decodes its piece (a newline as ↵), the prompt's and each step's
    assert shown[expected.prompt_length:] == [s.shown.replace("\n", "↵") for s in expected.steps]
    assert shown[:expected.prompt_length] == [t.shown.replace("\n", "↵") for t in expected.prompt_tokens]
    assert "✓ verified" in status and "6 tokens" in status, status
    assert sampled == [s.piece for s in generate(PROMPT, model=str(decoder_dir), max_new_tokens=6, temperature=1.5,
                                                 top_p=0.9, seed=3).steps]
    assert stopped == [sampled[0]] and stop_status.startswith("stopped after 1 token"), stop_status
    assert errors == []
    assert requests and all(r.startswith(gen_server.url) for r in requests), requests
    assert "api/generate" in {r.removeprefix(gen_server.url) for r in requests}
