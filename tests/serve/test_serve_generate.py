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
from serve_support import Server, start_server

import attnscope
from attnscope.generating import generate

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
    assert [e["event"] for e in events] == ["token"] * 5 + ["done"]
    expected = generate(PROMPT, model=str(decoder_dir), max_new_tokens=5)
    assert [e["piece"] for e in events[:5]] == [s.piece for s in expected.steps]
    done = events[-1]
    assert done["check"]["ok"] and len(done["steps"]) == 5
    assert done["steps"][4]["keys"] == expected.query_position(4) + 1


@pytest.mark.parametrize(("body", "status", "message"), [
    ({"prompt": PROMPT, "max_new_tokens": 65}, 422, "max_new_tokens"),
    ({"prompt": PROMPT, "model": "minilm"}, 422, "is an encoder and cannot generate"),
    ({"prompt": "word " * 40}, 422, "over this server's limit of 32"),
    ({"prompt": " "}, 422, "field 'prompt' is empty"),
])
def test_generate_refusals_are_one_line(gen_server: Server, body: dict[str, object], status: int,
                                        message: str) -> None:
    r = httpx.post(gen_server.url + "api/generate", json=body, headers=gen_server.auth, timeout=60)
    assert r.status_code == status, r.text
    assert message in r.json()["error"] and "\n" not in r.json()["error"]
