"""`POST /api/generate`: a generation streamed as NDJSON, one line per step as the model writes it.

Lines: {"event": "start", ...} once, with what the view needs before any step (model, prompt tokens);
{"event": "token", ...} for each step as soon as its token is chosen (token, probability, top
alternatives); then {"event": "done", ...} with the whole generation view payload (every step's attention
rows and the check), or {"event": "error", "error": "<one line>"} if it fails once streaming has begun,
or if the next line would take the stream past --max-response (the last line is always done or error).
Sized before it starts: a request whose max_new_tokens steps could pass --max-response is refused with 422
naming how many new tokens fit (stream_bytes); the cut at the limit stays as a last resort.
Bounded like the other endpoints: max_new_tokens (at most REQUEST_NEW_TOKENS), the prompt's characters and
tokens, the pool's queue and deadline (a job past it, or whose client left, stops at its next token).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from starlette.responses import Response, StreamingResponse

from attnscope.errors import AttnscopeError
from attnscope.models import Model
from attnscope.serve.fields import Field, RequestError, refuse_over_limit
from attnscope.serve.pool import Cancelled, InferencePool, PoolBusy, PoolTimeout, checkpoint
from attnscope.serve.service import Service
from attnscope.serve.settings import Settings
from attnscope.tokens import piece_decoder
from attnscope.tracing.decoding import MIN_TEMPERATURE, generate

REQUEST_NEW_TOKENS = 64  # the most new tokens one request to /api/generate may ask for
_ERROR_LINE_BYTES = 1024  # kept back from the response budget for the final error line
_TOKEN_LINE_BYTES = 1024  # about the most a step's token line takes (token, probability, 5 alternatives)
NDJSON = "application/x-ndjson"
MAX_TEMPERATURE = 100.0
MAX_TOP_K = 1000


@dataclass(frozen=True)
class GenerateRequest:
    prompt: str
    model: str | None
    max_new_tokens: int
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None


def generate_fields(settings: Settings, models: Sequence[str]) -> list[Field]:
    return [
        Field("prompt", "string", "The text to continue.", required=True, max_length=settings.max_chars),
        Field("model", "string", "A decoder this server serves (GET /api/models); null for the default.",
              nullable=True, enum=tuple(models)),
        Field("max_new_tokens", "integer", "At most this many new tokens (stops at end of sequence).",
              default=16, minimum=1, maximum=REQUEST_NEW_TOKENS),
        Field("temperature", "number", "Sample at this temperature (null: greedy unless top_k or top_p is set).",
              nullable=True, minimum=MIN_TEMPERATURE, maximum=MAX_TEMPERATURE),
        Field("top_k", "integer", "Sample from the k most probable tokens only (null: all).", nullable=True,
              minimum=1, maximum=MAX_TOP_K),
        Field("top_p", "number", "Sample from the smallest set of tokens whose probability reaches p (null: all).",
              nullable=True, minimum=0, exclusive_minimum=True, maximum=1),
        Field("seed", "integer", "Seed of the sampling, for a repeatable result (the same as attnscope.generate's).",
              nullable=True, minimum=0, maximum=2**32 - 1),
    ]


def run_generation(service: Service, req: GenerateRequest, emit: Callable[[dict[str, Any]], None],
                   stop: threading.Event) -> dict[str, Any]:
    """On a pool worker: generate, emitting each token as it is chosen; returns the view payload."""
    from attnscope.views.generation import generation_payload, token_payload

    m = service.model(req.model)
    ids = m.tokenizer(req.prompt)["input_ids"]
    n_prompt = len(ids)
    refuse_over_limit(service, n_prompt, "the prompt")

    start = _start(m, [str(t) for t in m.tokenizer.convert_ids_to_tokens(ids)])
    validate_size(m, len(_line(start)), n_prompt, req.max_new_tokens, service.settings.max_response_bytes)

    def on_token(step: Any) -> None:
        checkpoint(stop)  # the client left or the deadline passed: stop writing
        if step.step == 0:  # the prompt was accepted: the page can lay out the view
            emit(start)
        emit({"event": "token", **token_payload(step)})

    with service.model_lock(m):
        checkpoint(stop)
        g = generate(req.prompt, model=m, max_new_tokens=req.max_new_tokens, temperature=req.temperature,
                     top_k=req.top_k, top_p=req.top_p, seed=req.seed, on_token=on_token)
    return {"event": "done", **generation_payload(g)}


def _start(m: Any, prompt_tokens: list[str]) -> dict[str, Any]:
    """The first line: the generation view's payload without steps (the check comes with "done"); prompt_shown:
    each prompt token as the page shows it, the tokenizer's own decoding of the piece (" the" for "Ġthe")."""
    decode = piece_decoder(m.tokenizer)
    return {"event": "start", "title": f"{m.name}: generation from a {len(prompt_tokens)}-token prompt",
            "model": {"name": m.name, "layers": m.n_layers, "heads": m.n_heads},
            "prompt_tokens": prompt_tokens, "prompt_length": len(prompt_tokens),
            "prompt_shown": prompt_tokens if decode is None else [decode(t) for t in prompt_tokens]}


def stream_bytes(m: Model, start_bytes: int, n_prompt: int, new_tokens: int) -> int:
    """About the most bytes a stream of new_tokens steps sends: the start line, a token line per step, and the done
    line: the start line's fields again, and per step its token's fields and its attention rows, uint16 in base64,
    weights [layer, head, key] and rollout [layer, key] over at most n_prompt + step + 1 keys."""
    keys = new_tokens * (n_prompt + 1) + new_tokens * (new_tokens - 1) // 2  # sum over steps of their keys
    rows = m.n_layers * (m.n_heads + 1)
    per_step = 2 * _TOKEN_LINE_BYTES + 4 * 2  # the token line, its fields in done, base64 padding
    return 2 * start_bytes + new_tokens * per_step + -(-2 * rows * keys // 3) * 4


def validate_size(m: Model, start_bytes: int, n_prompt: int, new_tokens: int, budget: int) -> None:
    """Refuse (422) before the first token a stream whose max_new_tokens steps could pass --max-response, naming
    how many new tokens fit; the cut of a stream that still grows past it (_within) stays as a last resort."""
    room = budget - _ERROR_LINE_BYTES
    size = stream_bytes(m, start_bytes, n_prompt, new_tokens)
    if size <= room:
        return
    fits = max((t for t in range(new_tokens) if stream_bytes(m, start_bytes, n_prompt, t) <= room), default=0)
    advice = (f"ask for at most {fits} new tokens (max_new_tokens), or" if fits else "ask for")
    raise AttnscopeError(f"the generation could take about {size / 2**20:.1f} MiB ({new_tokens} steps of attention "
                         f"rows, {m.n_layers} layers x {m.n_heads} heads, over a {n_prompt}-token prompt), over the "
                         f"server's --max-response of {budget / 2**20:g} MiB: {advice} a shorter prompt, or start "
                         "the server with a larger --max-response",
                         parameter="max_new_tokens")


async def stream_generation(pool: InferencePool, service: Service, req: GenerateRequest) -> Response:
    """Start the job; refuse with a status if it fails before its first token, else stream its lines."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    budget = service.settings.max_response_bytes

    def emit(event: dict[str, Any]) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, event)

    job = asyncio.ensure_future(pool.run(run_generation, service, req, emit))
    first = asyncio.ensure_future(queue.get())
    await asyncio.wait({job, first}, return_when=asyncio.FIRST_COMPLETED)
    if not first.done():
        first.cancel()
        _raise_failure(job)  # finished before its first token: a status, not a stream
        return StreamingResponse(_within(_lines([job.result()]), budget, job), media_type=NDJSON)
    return StreamingResponse(_within(_follow(first.result(), queue, job), budget, job), media_type=NDJSON)


def _raise_failure(job: asyncio.Future[Any]) -> None:
    exc = job.exception()
    if exc is None:
        return
    if isinstance(exc, PoolBusy):
        raise RequestError(503, f"{exc}: retry in a moment") from exc
    if isinstance(exc, PoolTimeout | Cancelled):
        raise RequestError(504, f"{exc}: ask for fewer new tokens") from exc
    if isinstance(exc, AttnscopeError):
        raise RequestError(422, str(exc)) from exc
    raise exc


async def _lines(events: list[dict[str, Any]]) -> AsyncIterator[bytes]:
    for e in events:
        yield _line(e)


async def _follow(first: dict[str, Any], queue: asyncio.Queue[dict[str, Any]],
                  job: asyncio.Future[Any]) -> AsyncIterator[bytes]:
    """The lines as the worker emits them, then the final one; a client that leaves stops the job."""
    try:
        yield _line(first)
        while True:
            get = asyncio.ensure_future(queue.get())
            await asyncio.wait({get, job}, return_when=asyncio.FIRST_COMPLETED)
            if get.done():
                yield _line(get.result())
                continue
            get.cancel()
            while not queue.empty():
                yield _line(queue.get_nowait())
            try:
                _raise_failure(job)
                yield _line(job.result())
            except RequestError as exc:
                yield _line({"event": "error", "error": exc.message})
            return
    finally:
        if not job.done():
            job.cancel()  # the pool sets the job's stop event: it ends at its next token


async def _within(lines: AsyncIterator[bytes], budget: int, job: asyncio.Future[Any]) -> AsyncIterator[bytes]:
    """The lines while they fit in `budget` bytes; a line that would not ends the stream with an error line."""
    sent, tokens = 0, 0
    try:
        async for line in lines:
            if sent + len(line) + _ERROR_LINE_BYTES > budget:
                yield _line({"event": "error", "error": _too_large(budget, sent + len(line), tokens)})
                return
            sent += len(line)
            tokens += line.startswith(b'{"event": "token"')
            yield line
    finally:
        if not job.done():
            job.cancel()  # the job stops at its next token
        await _close(lines)


async def _close(lines: AsyncIterator[bytes]) -> None:
    close = getattr(lines, "aclose", None)
    if close is not None:
        await close()


def _too_large(budget: int, size: int, tokens: int) -> str:
    return (f"the response limit was reached: the stream would pass the server's --max-response of "
            f"{budget / 2**20:g} MiB (at least {size} bytes) after {tokens} tokens: ask for fewer new tokens "
            "(max_new_tokens) or a shorter prompt, or start the server with a larger --max-response")


def _line(event: dict[str, Any]) -> bytes:
    return (json.dumps(event, ensure_ascii=False, allow_nan=False) + "\n").encode("utf-8")
