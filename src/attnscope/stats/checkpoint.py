"""A corpus run's checkpoint: OUTDIR/checkpoint.json holds the exact state and the position after it.

Both engines (local and Ray) write and read the same format, so either continues the other's run.
A resume must match the checkpoint's identity: the model, the source, every guarded setting
(attnscope.stats.settings.guarded, derived from the Settings dataclass) and the metrics; what
differs is named in a one-line refusal.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnscope.errors import AttnscopeError
from attnscope.stats.settings import Settings, guarded
from attnscope.stats.state import StatsState

if TYPE_CHECKING:
    from attnscope.models import Model
    from attnscope.stats.sources import Source

log = logging.getLogger(__name__)

FILE = "checkpoint.json"
Position = tuple[int, int]  # (chunk, batch) of the next batch to run


@dataclass(frozen=True)
class Checkpoint:
    identity: dict[str, Any]  # what a resume must match
    state: StatsState  # the batches before `position`, merged
    position: Position
    complete: bool


def identity(model: Model, source: Source, settings: Settings, metrics: Sequence[str]) -> dict[str, Any]:
    """What a checkpoint must match to be resumed: the model, the source, the guarded settings and the
    metrics (e.g. the "norms" set adds some), so the remaining batches are the same and every metric
    counts every document. JSON-able."""
    values = settings.to_json()
    found = {"model": model.name, "source": source.describe(), "settings": {k: values[k] for k in guarded()},
             "metrics": list(metrics)}
    dtype = str(model.dtype).removeprefix("torch.")
    if dtype != "float32":  # another --dtype gives other numbers (float32 checkpoints stay as they were)
        found["dtype"] = dtype
    return found


def save(outdir: str | os.PathLike[str], identity: dict[str, Any], state: StatsState, position: Position,
         complete: bool) -> None:
    """Write the checkpoint atomically (a kill mid-write leaves the previous one)."""
    out = Path(outdir)
    data = {"identity": identity, "chunk": position[0], "batch": position[1], "complete": complete,
            "state": state.to_dict()}
    tmp = out / (FILE + ".tmp")
    tmp.write_text(json.dumps(data), encoding="utf-8")
    os.replace(tmp, out / FILE)


def load(outdir: str | os.PathLike[str]) -> Checkpoint:
    """The checkpoint in outdir, or a one-line error saying why it cannot be read."""
    path = Path(outdir) / FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return Checkpoint(data["identity"], StatsState.from_dict(data["state"]), (int(data["chunk"]),
                          int(data["batch"])), bool(data["complete"]))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise AttnscopeError(f"cannot read {path} ({exc}): choose another output directory") from exc
    except (KeyError, TypeError, ValueError) as exc:
        raise AttnscopeError(f"{path} is not a checkpoint of this attnscope version: choose another output "
                             "directory") from exc


def saved_documents(outdir: str | os.PathLike[str]) -> int | None:
    """How many documents the checkpoint in outdir holds (None: no readable checkpoint)."""
    try:
        return load(outdir).state.documents
    except AttnscopeError:
        return None


def validate_resume(checkpoint: Checkpoint, identity: dict[str, Any], where: str = FILE) -> None:
    """Refuse, in one line naming each difference, to resume a checkpoint of another run."""
    changed = differences(checkpoint.identity, json.loads(json.dumps(identity)))
    if changed:
        raise AttnscopeError(f"{where} is from a run with other arguments ({changed}): resume with the same "
                             "arguments, or choose another output directory")


def start(outdir: str | os.PathLike[str], identity: dict[str, Any], resume: bool) -> Checkpoint | None:
    """The checkpoint to continue from (None: a new run, outdir created). Without resume an existing,
    non-empty outdir is refused; with it, a checkpoint of another run is."""
    out = Path(outdir)
    if not resume:
        if out.exists() and (not out.is_dir() or any(out.iterdir())):
            raise AttnscopeError(f"{out} already exists and is not empty: pass resume=True to continue that run, "
                                 "or choose another outdir", parameter="resume")
        _mkdir(out)
        return None
    if not (out / FILE).is_file():
        if out.exists() and any(out.iterdir()):
            raise AttnscopeError(f"{out} has no {FILE} to resume from: choose another outdir")
        _mkdir(out)
        return None
    checkpoint = load(out)
    validate_resume(checkpoint, identity, str(out / FILE))
    log.info("resuming %s at chunk %d, batch %d", out, *checkpoint.position)
    return checkpoint


def kept(exc: AttnscopeError, outdir: str | os.PathLike[str], identity: dict[str, Any], state: StatsState,
         position: Position, done_before: int) -> AttnscopeError:
    """The error of a run stopped part-way, after checkpointing the documents done before it."""
    if state.documents == done_before:
        return exc
    save(outdir, identity, state, position, complete=False)
    return AttnscopeError(f"{exc} ({state.documents} documents before it are checkpointed in {outdir}: "
                          "fix the cause and run again with resume=True to continue)")


def _mkdir(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise AttnscopeError(f"cannot create the output directory {out}: {exc.strerror or exc}: "
                             "choose another outdir") from exc


def differences(then: Any, now: dict[str, Any]) -> str:
    """What differs between a checkpoint's identity and this run's, e.g. "settings.max_length 256 -> 128"."""
    if not isinstance(then, dict):
        return "a checkpoint of another attnscope version"
    flat_then, flat_now = _flat(then), _flat(now)
    out = []
    for key in dict.fromkeys([*flat_then, *flat_now]):
        old, new = flat_then.get(key, "(none)"), flat_now.get(key, "(none)")
        if old == new:
            continue
        if key == "metrics" and isinstance(old, list) and isinstance(new, list):  # name what was added or dropped
            out.append(f"{key} " + ", ".join([f"+{m}" for m in new if m not in old] +
                                             [f"-{m}" for m in old if m not in new]))
        else:
            out.append(f"{key} {old} -> {new}")
    return "; ".join(out)


def _flat(identity: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}"""
    out: dict[str, Any] = {}
    for key, value in identity.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out
