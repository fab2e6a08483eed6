"""Watch a decoder write: capture every step's attention inside the real `model.generate` loop.

The model generates with its own loop and its KV cache; attention goes through the registered
"attnscope" function (attnscope.capture.recording), which hands each call to a StepRecorder. The
recorder keeps only the rows each step computed (its new queries, new keys and values, and their weight
rows), never the cache itself, so the trace grows with the rows kept. attnscope.generate_check then
verifies every step (see there). The module is not named `generate`: that name is the function,
`attnscope.generate`.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch import nn
from transformers import LogitsProcessor, LogitsProcessorList, PreTrainedModel
from transformers.generation.streamers import BaseStreamer

from attnscope import maths
from attnscope.arrays import Pending, TraceArrays
from attnscope.capture import AttentionCall, attention_modules, recording
from attnscope.errors import AttnscopeError, require_text
from attnscope.families import family_of
from attnscope.generation import Alternative, GeneratedToken, GenerationTrace
from attnscope.models import Model, ModelLike, describe, load_model
from attnscope.tokens import Token, encode
from attnscope.traces import Trace

log = logging.getLogger(__name__)

MAX_NEW_TOKENS = 1024


class GenerationInterrupted(KeyboardInterrupt):
    """Ctrl-C during generate(): `partial` holds the steps finished before it (None if none were)."""

    def __init__(self, partial: GenerationTrace | None) -> None:
        super().__init__("generation interrupted")
        self.partial = partial


def validate_settings(max_new_tokens: int, temperature: float | None, top_k: int | None, top_p: float | None,
                      alternatives: int) -> None:
    """One-line errors for sampling settings out of range (before any model is loaded)."""
    if not 1 <= max_new_tokens <= MAX_NEW_TOKENS:
        raise AttnscopeError(f"max_new_tokens {max_new_tokens} is out of range: use 1..{MAX_NEW_TOKENS}",
                             parameter="max_new_tokens")
    if temperature is not None and not temperature > 0:
        raise AttnscopeError(f"temperature {temperature} is out of range: use a number above 0 (1 samples as is)",
                             parameter="temperature")
    if top_k is not None and top_k < 1:
        raise AttnscopeError(f"top_k {top_k} is out of range: use at least 1", parameter="top_k")
    if top_p is not None and not 0 < top_p <= 1:
        raise AttnscopeError(f"top_p {top_p} is out of range: use a number in (0, 1]", parameter="top_p")
    if not 1 <= alternatives <= 100:
        raise AttnscopeError(f"alternatives {alternatives} is out of range: use 1..100", parameter="alternatives")


def require_decoder(m: Model) -> None:
    """A model that can write: a causal language model with its LM head."""
    fam = family_of(m.model)
    if fam is not None and not fam.causal:
        raise AttnscopeError(f"{m.name} ({m.architecture}) is an encoder and cannot generate text: "
                             "use a decoder such as 'smollm2'")
    if not m.model.can_generate():
        raise AttnscopeError(f"{m.name} ({m.architecture}) has no language-modeling head and cannot generate "
                             "text: load it as a causal LM (AutoModelForCausalLM) or use 'smollm2'")


class StepRecorder:
    """Keeps, per attention call, the rows its forward pass added: nothing of the cache before them."""

    def __init__(self) -> None:
        self.calls: list[dict[str, torch.Tensor]] = []  # in call order: layer 0..L-1 of step 0, then step 1, ...
        self.x: list[torch.Tensor] = []  # [new, d_model] per call
        self.output: list[torch.Tensor] = []

    def on_attention(self, call: AttentionCall) -> None:
        n = int(call.q.shape[2])  # the queries this forward pass added: the prompt, then 1 per step
        self.calls.append({
            "q": call.q[0],  # [head, new, d_head]
            "k": call.k[0, :, -n:].clone(),  # [kv_head, new, d_head]: a copy, so the cache is not kept alive
            "v": call.v[0, :, -n:].clone(),
            "weights": call.weights[0],  # [head, new, key]
            "context": call.context[0],  # [head, new, d_head]
        })


@contextlib.contextmanager
def recording_steps(model: PreTrainedModel, recorder: StepRecorder) -> Iterator[None]:
    """Route attention through the recorder and hook x (attention input) and output per layer."""
    fam = family_of(model)
    handles = []
    for mod in attention_modules(model):
        handles.append(mod.register_forward_pre_hook(_x_hook(recorder), with_kwargs=True))
        if fam is not None:
            proj = fam.out_proj(model, mod)
            handles.append(proj.register_forward_hook(lambda _m, _i, out: recorder.output.append(out[0].detach())))
    try:
        with recording(model, recorder):
            yield
    finally:
        for h in handles:
            h.remove()


def _x_hook(recorder: StepRecorder) -> Callable[..., None]:
    def hook(_module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        x = args[0] if args else kwargs["hidden_states"]
        recorder.x.append(x[0].detach())  # [new, d_model]

    return hook


class _Distribution(LogitsProcessor):
    """Keeps the log-probabilities of the latest step (before the sampling warpers), changing nothing."""

    def __init__(self) -> None:
        self.latest: torch.Tensor | None = None  # [vocab]

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        self.latest = torch.log_softmax(scores[0].float(), dim=-1)
        return scores


class _Steps(BaseStreamer):
    """Turns each token model.generate emits into a GeneratedToken, and tells the caller at once."""

    def __init__(self, m: Model, dist: _Distribution, prompt_length: int, alternatives: int,
                 on_token: Callable[[GeneratedToken], None] | None) -> None:
        self.m, self.dist, self.prompt_length, self.k = m, dist, prompt_length, alternatives
        self.on_token = on_token
        self.ids: list[int] = []
        self.steps: list[GeneratedToken] = []
        self._seen_prompt = False
        self._text = ""

    def put(self, value: torch.Tensor) -> None:
        if not self._seen_prompt:  # the first call hands over the prompt
            self._seen_prompt = True
            return
        token_id = int(value.reshape(-1)[0])
        step = self._step(token_id)
        self.steps.append(step)
        if self.on_token is not None:
            self.on_token(step)

    def end(self) -> None:
        pass

    def _step(self, token_id: int) -> GeneratedToken:
        tok = self.m.tokenizer
        logp = self.dist.latest
        assert logp is not None, "a token before its distribution"
        top = torch.topk(logp, min(self.k, int(logp.shape[0])))
        alts = [Alternative(int(i), str(tok.convert_ids_to_tokens(int(i))), float(p.exp()))
                for p, i in zip(top.values, top.indices, strict=True)]
        self.ids.append(token_id)
        text = str(tok.decode(self.ids, skip_special_tokens=True))
        piece, self._text = text[len(self._text):], text
        n = len(self.steps)
        return GeneratedToken(n, self.prompt_length + n, token_id, str(tok.convert_ids_to_tokens(token_id)), piece,
                              float(logp[token_id].exp()), alts, token_id in tok.all_special_ids)


@contextlib.contextmanager
def _seeded(seed: int | None) -> Iterator[None]:
    """A seeded RNG for sampling that leaves the caller's global RNG as it was."""
    if seed is None:
        yield
        return
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def generate(
    prompt: str, model: ModelLike = None, max_new_tokens: int = 20, temperature: float | None = None,
    top_k: int | None = None, top_p: float | None = None, seed: int | None = None, alternatives: int = 5,
    verify: bool = True, on_token: Callable[[GeneratedToken], None] | None = None,
) -> GenerationTrace:
    """Generate after prompt with the model's own `generate` and KV cache, tracing every step's attention.

    Greedy unless temperature, top_k or top_p is given (then sampled; seed makes it repeatable). Stops at
    the model's end-of-sequence token or after max_new_tokens. on_token is called with each new token as
    soon as it is chosen. verify=True checks every step (attnscope.generate_check). Ctrl-C raises
    GenerationInterrupted carrying the steps finished so far.
    """
    require_text(prompt, "prompt")
    validate_settings(max_new_tokens, temperature, top_k, top_p, alternatives)
    m = load_model(model)
    require_decoder(m)
    prompt_tokens, inputs = _encode_prompt(m, prompt, max_new_tokens)
    do_sample = any(v is not None for v in (temperature, top_k, top_p))
    settings = {"max_new_tokens": max_new_tokens, "do_sample": do_sample, "temperature": temperature,
                "top_k": top_k, "top_p": top_p, "seed": seed}
    recorder, dist = StepRecorder(), _Distribution()
    steps = _Steps(m, dist, len(prompt_tokens), alternatives, on_token)
    sampling = {"temperature": temperature or 1.0, "top_k": top_k or 0, "top_p": top_p or 1.0} if do_sample else {}
    try:
        with torch.no_grad(), _seeded(seed), recording_steps(m.model, recorder):
            m.model.generate(  # type: ignore[operator]
                **inputs, max_new_tokens=max_new_tokens, do_sample=do_sample, **sampling,
                logits_processor=LogitsProcessorList([dist]), streamer=steps, pad_token_id=_pad_id(m))
    except KeyboardInterrupt as exc:
        partial = _finish(m, prompt, prompt_tokens, recorder, steps, settings, "interrupted", verify)
        raise GenerationInterrupted(partial) from exc
    stopped = "max_new_tokens" if len(steps.steps) >= max_new_tokens else "eos"
    result = _finish(m, prompt, prompt_tokens, recorder, steps, settings, stopped, verify)
    assert result is not None
    return result


def _encode_prompt(m: Model, prompt: str, max_new_tokens: int) -> tuple[list[Token], dict[str, torch.Tensor]]:
    enc = encode(m.tokenizer, [prompt], None, max_length=m.max_positions, truncate=False)
    n = len(enc.tokens[0])
    if n + max_new_tokens > m.max_positions:
        raise AttnscopeError(f"max_new_tokens {max_new_tokens} is out of range: the prompt has {n} tokens and "
                             f"{m.name} reads at most {m.max_positions} positions, so use at most "
                             f"{m.max_positions - n}", parameter="max_new_tokens")
    return enc.tokens[0], {k: v for k, v in enc.inputs.items() if k in ("input_ids", "attention_mask")}


def _pad_id(m: Model) -> int | None:
    tok = m.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    return None if pad is None else int(pad)


def _finish(m: Model, prompt: str, prompt_tokens: list[Token], recorder: StepRecorder, steps: _Steps,
            settings: dict[str, Any], stopped: str, verify: bool) -> GenerationTrace | None:
    """The generation trace of every step both recorded in full and emitted as a token."""
    n_layers = len(attention_modules(m.model))
    n_steps = min(len(steps.steps), *(len(kept) // n_layers for kept in (recorder.calls, recorder.x, recorder.output)))
    if n_steps == 0:
        return None
    arrays = assemble(recorder, n_layers, n_steps)
    for kept in (recorder.calls, recorder.x, recorder.output):
        kept.clear()  # the rows now live in the arrays only
    layers = per_layer(arrays)
    new = [Token(s.position, s.text, s.id, None, None, s.special, None, 0) for s in steps.steps[: n_steps - 1]]
    fam = family_of(m.model)
    info = {**describe(m), "family": fam.name if fam else None, "x_source": fam.x_source if fam else None,
            "causal": True, "layers": n_layers, "d_head": int(layers["q"][0].shape[-1]),
            "d_model": int(layers["x"][0].shape[-1])}
    scaling = [float(s) for s in _scalings(m, n_layers)]
    tr = Trace(info, prompt, None, [*prompt_tokens, *new], trace_arrays(arrays), scaling)
    if verify:
        from attnscope.generate_check import verify_generation

        ids = [t.id for t in tr.tokens]
        tr.comparisons, tr.unsupported = verify_generation(m, layers, torch.tensor([ids]), len(prompt_tokens), n_steps)
    else:
        tr.unsupported = "not verified: generated with verify=False"
    completion = str(m.tokenizer.decode([s.id for s in steps.steps[:n_steps]], skip_special_tokens=True))
    return GenerationTrace(prompt, tr, prompt_tokens, steps.steps[:n_steps], completion, settings, stopped)


def _scalings(m: Model, n_layers: int) -> list[float]:
    from attnscope.recompute import layer_params

    params = layer_params(m.model)
    if params is not None:
        return [p.scaling for p in params]
    mods = attention_modules(m.model)
    return [float(getattr(mod, "scaling", 1.0)) for mod in mods][:n_layers]


def assemble(recorder: StepRecorder, n_layers: int, n_steps: int) -> dict[str, np.ndarray]:
    """Every step's rows laid out as one sequence: stage -> [layer, ...] (the axes of attnscope.stages).

    Rows: the prompt's (step 0), then one per later step. Weights are [layer, head, query, key] with 0 for
    the keys a row could not see yet (as the causal softmax gives). Grouped k/v heads are repeated per query
    head. Written once, straight into the arrays the trace keeps.
    """
    first = recorder.calls[0]
    n_heads, n_prompt, d_head = (int(n) for n in first["q"].shape)
    n_rows, d_model = n_prompt + n_steps - 1, int(recorder.x[0].shape[-1])
    dtype = np.float64 if first["q"].dtype == torch.float64 else np.float32
    out = {s: np.empty((n_layers, n_heads, n_rows, d_head), dtype) for s in ("q", "k", "v", "context")}
    out["weights"] = np.zeros((n_layers, n_heads, n_rows, n_rows), dtype)  # [layer, head, query, key]
    out.update({s: np.empty((n_layers, n_rows, d_model), dtype) for s in ("x", "output")})
    dst = {s: torch.from_numpy(a) for s, a in out.items()}  # views: filled in place
    for step in range(n_steps):
        rows = slice(0, n_prompt) if step == 0 else slice(n_prompt + step - 1, n_prompt + step)
        for layer in range(n_layers):
            i = step * n_layers + layer
            for stage, t in recorder.calls[i].items():
                t = maths.expand_kv(t, n_heads // int(t.shape[0]))  # [head, new, width]
                dst[stage][layer, :, rows, : t.shape[-1]] = t
            dst["x"][layer, rows] = recorder.x[i]  # [new, d_model]
            dst["output"][layer, rows] = recorder.output[i]
    return out


def per_layer(arrays: dict[str, np.ndarray]) -> dict[str, list[torch.Tensor]]:
    """stage -> one [1, ...] tensor per layer, views of the arrays (what the verification reads)."""
    return {s: [t[None] for t in torch.from_numpy(a)] for s, a in arrays.items()}


def trace_arrays(arrays: dict[str, np.ndarray]) -> TraceArrays:
    """The trace's arrays, with scores (q k^T) computed when first read."""
    def scores() -> np.ndarray:
        q, k = torch.from_numpy(arrays["q"]), torch.from_numpy(arrays["k"])  # [layer, head, token, d_head]
        return (q @ k.transpose(-1, -2)).numpy()  # [layer, head, query, key]

    return TraceArrays({**arrays, "scores": Pending(scores)})


__all__ = ["MAX_NEW_TOKENS", "GenerationInterrupted", "GenerationTrace", "generate"]
