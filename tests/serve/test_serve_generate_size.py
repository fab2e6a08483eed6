"""A generate stream sized before it starts (issue 29): the estimate against real streams' sizes, and the cut at
--max-response, kept as a last resort for a stream that still grows past it, ends with an error line."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest
import torch
import transformers as T

import attnscope
from attnscope.errors import AttnscopeError
from attnscope.serve.generate import _line, _start, _within, stream_bytes, validate_size
from attnscope.views.generation import generation_payload, token_payload


@pytest.fixture(scope="module")
def decoder(tmp_path_factory: pytest.TempPathFactory, minilm: attnscope.Model) -> attnscope.Model:
    """A random-weight GPT-2 with its LM head (4 layers x 4 heads) and the bundled tokenizer."""
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("gpt2-lm")
    T.GPT2LMHeadModel(T.GPT2Config(n_embd=32, n_layer=4, n_head=4, vocab_size=30522, bos_token_id=101,
                                   eos_token_id=None)).save_pretrained(path)
    minilm.tokenizer.save_pretrained(path)
    return attnscope.load_model(str(path))


@pytest.mark.parametrize("new_tokens", [1, 6])
def test_the_estimate_bounds_a_real_streams_bytes(decoder: attnscope.Model, new_tokens: int) -> None:
    m = decoder
    prompt = "the keeper counted the waves"
    ids = m.tokenizer(prompt)["input_ids"]
    start = _start(m, [str(t) for t in m.tokenizer.convert_ids_to_tokens(ids)])
    g = attnscope.generate(prompt, model=m, max_new_tokens=new_tokens)
    sent = len(_line(start)) + sum(len(_line({"event": "token", **token_payload(s)})) for s in g.steps)
    sent += len(_line({"event": "done", **generation_payload(g)}))
    estimate = stream_bytes(m, len(_line(start)), len(ids), g.n_steps)
    assert sent <= estimate <= 3 * sent + 4096, (sent, estimate)


def test_validate_size_names_what_fits(decoder: attnscope.Model) -> None:
    m = decoder
    budget = stream_bytes(m, 500, 10, 20) + 1024  # exactly 20 steps fit, with the error line's reserve
    validate_size(m, 500, 10, 20, budget)
    with pytest.raises(AttnscopeError, match=r"ask for at most 20 new tokens \(max_new_tokens\)") as info:
        validate_size(m, 500, 10, 21, budget)
    assert info.value.parameter == "max_new_tokens"
    with pytest.raises(AttnscopeError, match="ask for a shorter prompt, or start the server with a larger"):
        validate_size(m, 500, 10, 5, 2048)


def test_a_stream_past_the_budget_is_cut_with_an_error_line() -> None:
    async def lines() -> AsyncIterator[bytes]:
        for i in range(100):
            yield _line({"event": "token", "step": i, "pad": "x" * 200})

    async def run() -> bytes:
        job: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        job.set_result(None)
        return b"".join([chunk async for chunk in _within(lines(), 4096, job)])

    raw = asyncio.run(run())
    events = [json.loads(x) for x in raw.splitlines()]
    size = len(_line({"event": "token", "step": 10, "pad": "x" * 200}))
    kept = (4096 - 1024) // size  # whole lines, the error line's reserve kept back
    assert len(raw) <= 4096 and events[-1]["event"] == "error"
    assert "response limit was reached" in events[-1]["error"] and f"after {kept} tokens" in events[-1]["error"]
    assert [e["event"] for e in events[:-1]] == ["token"] * kept
