"""Watch a decoder write: capture every step's attention inside the real `model.generate` loop.

The model generates with its own loop and its KV cache; attention goes through the registered
"attnscope" function (attnscope.capture.recording), which hands each call to a StepRecorder. The
recorder keeps only the rows each step computed (its new queries, new keys and values, and their weight
rows), never the cache itself, so the trace grows with the rows kept. attnscope.verify.decoding then
verifies every step (see there). The module is not named `generate`: that name is the function,
`attnscope.generate`.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from transformers import LogitsProcessor, LogitsProcessorList, PreTrainedModel, PreTrainedTokenizerBase
from transformers.generation.streamers import BaseStreamer

from attnscope.capture import AttentionCall, attention_modules, hooked
from attnscope.errors import AttnscopeError, require_text
from attnscope.families import FAMILIES, family_of, is_encoder_decoder, why_unsupported
from attnscope.models import Model, ModelLike, describe_capture, load_model
from attnscope.records.arrays import Pending, TraceArrays, token_index
from attnscope.records.generation import Alternative, GeneratedToken, GenerationTrace
from attnscope.records.trace import Trace
from attnscope.tokens import Token, encode, piece_decoder
from attnscope.tracing import rows

log = logging.getLogger(__name__)

NEW_TOKENS_LIMIT = 1024  # the most new tokens generate() writes in one call


class GenerationInterrupted(KeyboardInterrupt):
    """Ctrl-C during generate(): `partial` holds the steps finished before it (None if none were)."""

    def __init__(self, partial: GenerationTrace | None) -> None:
        super().__init__("generation interrupted")
        self.partial = partial


MIN_TEMPERATURE = 1e-4  # below it, float32 logits / T overflow to inf and sampling breaks: sample greedily instead
MAX_SEED = 2**64 - 1  # torch's generator takes 64-bit seeds


def validate_settings(max_new_tokens: int, temperature: float | None, top_k: int | None, top_p: float | None,
                      alternatives: int, seed: int | None = None) -> None:
    """One-line errors for sampling settings out of range (before any model is loaded)."""
    if not 1 <= max_new_tokens <= NEW_TOKENS_LIMIT:
        raise AttnscopeError(f"max_new_tokens {max_new_tokens} is out of range: use 1..{NEW_TOKENS_LIMIT}",
                             parameter="max_new_tokens")
    if temperature is not None and not MIN_TEMPERATURE <= temperature < math.inf:  # inf: every logit 0
        raise AttnscopeError(f"temperature {temperature} is out of range: use a finite number from {MIN_TEMPERATURE} "
                             "(1 samples as is; leave it out to choose greedily)", parameter="temperature")
    if top_k is not None and top_k < 1:
        raise AttnscopeError(f"top_k {top_k} is out of range: use at least 1", parameter="top_k")
    if top_p is not None and not 0 < top_p <= 1:
        raise AttnscopeError(f"top_p {top_p} is out of range: use a number in (0, 1]", parameter="top_p")
    if not 1 <= alternatives <= 100:
        raise AttnscopeError(f"alternatives {alternatives} is out of range: use 1..100", parameter="alternatives")
    if seed is not None and not 0 <= seed <= MAX_SEED:
        raise AttnscopeError(f"seed {seed} is out of range: use 0..{MAX_SEED}", parameter="seed")


def require_decoder(m: Model) -> None:
    """A model that can write: a causal language model with its LM head."""
    fam = family_of(m.model)
    if is_encoder_decoder(m.model):
        raise AttnscopeError(f"{m.name} ({m.architecture}) is an encoder-decoder model: it writes a target for a "
                             "source with attnscope.generate_seq2seq (attnscope generate SOURCE --model M)")
    if fam is not None and not fam.causal:
        raise AttnscopeError(f"{m.name} ({m.architecture}) is an encoder and cannot generate text: "
                             "use a decoder such as 'smollm2'")
    if not m.model.can_generate():
        raise AttnscopeError(f"{m.name} ({m.architecture}) has no language-modeling head and cannot generate "
                             "text: load it as a causal LM (AutoModelForCausalLM) or use 'smollm2'")
    if fam is None or not attention_modules(m.model):  # its steps could be neither captured nor verified
        decoders = ", ".join(name for name, f in FAMILIES.items() if f.causal and f.cross is None)
        raise AttnscopeError(f"NOT VERIFIED: {why_unsupported(m.model)}; attnscope generate watches the decoder "
                             f"families it recomputes ({decoders}): use one, such as 'smollm2'")


class StepRecorder:
    """Writes the rows each forward pass adds straight into arrays [layer, ...] sized for the whole generation.

    Nothing of the cache is kept, and no small tensor per step: kept tensors between the cache's growing
    buffers fragment the heap until it holds a copy of the cache per step. The arrays are zeros from the
    system (calloc), so rows never written cost no memory. Calls arrive in layer order, step after step.
    """

    def __init__(self, n_layers: int, max_rows: int) -> None:
        self.n_layers, self.max_rows = n_layers, max_rows
        self.arrays: dict[str, np.ndarray] = {}  # stage -> [layer, ...] (the axes of attnscope.stages)
        self._dst: dict[str, torch.Tensor] = {}  # the same memory, as tensors
        self.counts = {"x": 0, "attention": 0, "output": 0}  # calls recorded, per hook
        self.prompt_rows = 0

    def _rows(self, kind: str, n: int) -> tuple[int, slice]:
        """The layer and the rows of the next call of this kind: the prompt's, then one row per step."""
        count = self.counts[kind]
        self.counts[kind] += 1
        layer, step = count % self.n_layers, count // self.n_layers
        start = 0 if step == 0 else self.prompt_rows + step - 1
        if start + n > self.max_rows:
            raise RuntimeError(f"generation wrote more rows than the {self.max_rows} it was sized for")
        return layer, slice(start, start + n)

    def _zeros(self, stage: str, shape: tuple[int, ...], dtype: torch.dtype) -> None:
        np_dtype = np.float64 if dtype == torch.float64 else np.float32
        self.arrays[stage] = np.zeros(shape, np_dtype)
        self._dst[stage] = torch.from_numpy(self.arrays[stage])

    def on_x(self, x: torch.Tensor) -> None:
        """x: [new, d_model], a layer's attention input."""
        if not self.counts["x"]:
            self.prompt_rows = int(x.shape[0])
            for stage in ("x", "output"):
                self._zeros(stage, (self.n_layers, self.max_rows, int(x.shape[-1])), x.dtype)
        layer, rows = self._rows("x", int(x.shape[0]))
        self._dst["x"][layer, rows] = x

    def on_output(self, out: torch.Tensor) -> None:
        layer, rows = self._rows("output", int(out.shape[0]))
        self._dst["output"][layer, rows] = out  # [new, d_model]

    def on_attention(self, call: AttentionCall) -> None:
        heads, n, d_head = (int(i) for i in call.q.shape[1:])  # n: the queries this forward pass added
        if not self.counts["attention"]:
            kv_heads = int(call.k.shape[1])  # k and v are kept per k/v head (grouped-query attention), as in a Trace
            for stage, n_heads in (("q", heads), ("k", kv_heads), ("v", kv_heads), ("context", heads)):
                self._zeros(stage, (self.n_layers, n_heads, self.max_rows, d_head), call.q.dtype)
            self._zeros("weights", (self.n_layers, heads, self.max_rows, self.max_rows), call.q.dtype)
        layer, rows = self._rows("attention", n)
        new = {"q": call.q[0], "k": call.k[0, :, -n:], "v": call.v[0, :, -n:], "weights": call.weights[0],
               "context": call.context[0]}  # [head | kv_head, new, width]
        for stage, t in new.items():
            width = int(t.shape[-1])
            # a sliding-window cache keeps only the last keys: a weights row ends at its own position
            cols = slice(rows.stop - width, rows.stop) if stage == "weights" and width < rows.stop else slice(0, width)
            self._dst[stage][layer, :, rows, cols] = t

    def steps(self) -> int:
        """Forward passes recorded in full (x, attention and output of every layer)."""
        return min(self.counts.values()) // self.n_layers

    def cut(self, n_rows: int) -> dict[str, np.ndarray]:
        """The arrays of the first n_rows positions (copied only when the generation stopped early)."""
        out = {}
        for stage, a in self.arrays.items():
            out[stage] = a if n_rows == self.max_rows else np.ascontiguousarray(a[token_index(stage, n_rows)])
        return out


@contextlib.contextmanager
def recording_steps(model: PreTrainedModel, recorder: StepRecorder) -> Iterator[None]:
    """Route attention through the recorder and hook x (attention input) and output per layer (batch row 0)."""
    with hooked(model, recorder, lambda x: recorder.on_x(x[0]), lambda out: recorder.on_output(out[0])):
        yield  # on_x and on_output get [new, d_model]


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
        self.decode = piece_decoder(m.tokenizer)  # each piece as the tokenizer decodes it alone
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
        self.ids.append(token_id)
        text = str(tok.decode(self.ids, skip_special_tokens=True))
        piece, self._text = text[len(self._text):], text
        n = len(self.steps)
        spelling, decoded = spelled(tok, self.decode, token_id)
        return GeneratedToken(step=n, position=self.prompt_length + n, id=token_id, text=spelling, decoded=decoded,
                              piece=piece, probability=float(logp[token_id].exp()),
                              alternatives=top_alternatives(tok, self.decode, logp, self.k),
                              special=token_id in tok.all_special_ids)


def spelled(tok: PreTrainedTokenizerBase, decode: Callable[[str], str] | None, token_id: int) -> tuple[str, str | None]:
    """A token id as the tokenizer spells its piece ("Ġthe") and as it decodes that piece alone (" the"; None for
    a tokenizer without a decoder, tokens.piece_decoder)."""
    text = str(tok.convert_ids_to_tokens(token_id))
    return text, None if decode is None else decode(text)


def top_alternatives(tok: PreTrainedTokenizerBase, decode: Callable[[str], str] | None, logp: torch.Tensor,
                     k: int) -> list[Alternative]:
    """The k most probable next tokens of log-probabilities logp [vocab], spelled and decoded."""
    top = torch.topk(logp, min(k, int(logp.shape[0])))
    out = []
    for p, i in zip(top.values.exp().tolist(), top.indices.tolist(), strict=True):  # exp in the logits' dtype
        text, decoded = spelled(tok, decode, int(i))
        out.append(Alternative(id=int(i), text=text, probability=float(p), decoded=decoded))
    return out


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
    soon as it is chosen. verify=True checks every step (attnscope.verify.decoding). Ctrl-C raises
    GenerationInterrupted carrying the steps finished so far.
    """
    require_text(prompt, "prompt")
    validate_settings(max_new_tokens, temperature, top_k, top_p, alternatives, seed)
    m = load_model(model)
    require_decoder(m)
    prompt_tokens, inputs = _encode_prompt(m, prompt, max_new_tokens)
    do_sample = any(v is not None for v in (temperature, top_k, top_p))
    settings = {"max_new_tokens": max_new_tokens, "do_sample": do_sample, "temperature": temperature,
                "top_k": top_k, "top_p": top_p, "seed": seed}
    recorder = StepRecorder(len(attention_modules(m.model)), len(prompt_tokens) + max_new_tokens - 1)
    dist = _Distribution()
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
        # Dynamic RoPE could go on, but past the limit it rotates each step's new keys with new frequencies
        # while the cache keeps the old ones: neither a recompute with one set nor a no-cache pass matches.
        why = " (dynamic RoPE: past them the cached keys keep older rotations, not verifiable)" \
            if _rope_type(m) == "dynamic" else ""
        raise AttnscopeError(f"max_new_tokens {max_new_tokens} is out of range: the prompt has {n} tokens and "
                             f"{m.name} reads at most {m.max_positions} positions{why}, so use at most "
                             f"{m.max_positions - n}", parameter="max_new_tokens")
    return enc.tokens[0], {k: v for k, v in enc.inputs.items() if k in ("input_ids", "attention_mask")}


def _rope_type(m: Model) -> str | None:
    rp = getattr(m.model.config, "rope_parameters", None) or getattr(m.model.config, "rope_scaling", None)
    return str(rp.get("rope_type")) if isinstance(rp, dict) and "rope_type" in rp else None


def _pad_id(m: Model) -> int | None:
    tok = m.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    return None if pad is None else int(pad)


def _finish(m: Model, prompt: str, prompt_tokens: list[Token], recorder: StepRecorder, steps: _Steps,
            settings: dict[str, Any], stopped: str, verify: bool) -> GenerationTrace | None:
    """The generation trace of every step both recorded in full and emitted as a token."""
    n_layers = len(attention_modules(m.model))
    n_steps = min(len(steps.steps), recorder.steps())
    if n_steps == 0:
        return None
    arrays = recorder.cut(len(prompt_tokens) + n_steps - 1)
    layers = per_layer(arrays)
    new = [Token(index=s.position, text=s.text, id=s.id, special=s.special, decoded=s.decoded)
           for s in steps.steps[: n_steps - 1]]
    fam = family_of(m.model)
    info = describe_capture(m, layers["q"][0], layers["k"][0], layers["x"][0], n_layers, causal=True)
    info["pre_norm"] = fam.pre_attention is not None if fam else None
    scaling = [float(s) for s in _scalings(m, n_layers, len(prompt_tokens) + n_steps)]
    tr = Trace(model=info, text=prompt, pair=None, tokens=[*prompt_tokens, *new], arrays=trace_arrays(arrays),
               scaling=scaling)
    if verify:
        from attnscope.verify.decoding import verify_generation

        ids = [t.id for t in tr.tokens]
        tr.comparisons, tr.unsupported = verify_generation(m, layers, torch.tensor([ids]), len(prompt_tokens), n_steps)
    else:
        tr.unsupported = "not verified: generated with verify=False"
    completion = str(m.tokenizer.decode([s.id for s in steps.steps[:n_steps]], skip_special_tokens=True))
    return GenerationTrace(prompt, tr, prompt_tokens, steps.steps[:n_steps], completion, settings, stopped)


def _scalings(m: Model, n_layers: int, n_positions: int) -> list[float]:
    from attnscope.verify.recompute import layer_params

    params = layer_params(m.model, n_positions=n_positions)  # the final sequence: dynamic RoPE depends on it
    if params is not None:
        return [p.scaling for p in params]
    mods = attention_modules(m.model)
    return [float(getattr(mod, "scaling", 1.0)) for mod in mods][:n_layers]


def per_layer(arrays: dict[str, np.ndarray]) -> dict[str, list[torch.Tensor]]:
    """stage -> one [1, ...] tensor per layer, views of the arrays (what the verification reads)."""
    return {s: [t[None] for t in torch.from_numpy(a)] for s, a in arrays.items()}


def trace_arrays(arrays: dict[str, np.ndarray]) -> TraceArrays:
    """The trace's arrays, with scores (q k^T) computed when first read."""
    return TraceArrays({**arrays, "scores": Pending(lambda: rows.scores(arrays))})


__all__ = ["NEW_TOKENS_LIMIT", "GenerationInterrupted", "GenerationTrace", "generate"]
