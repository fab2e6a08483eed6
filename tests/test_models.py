"""Loading models: the bundled default, local checkpoints, loaded objects, and fast offline failure."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import attnscope
from attnscope import gguf_cache
from attnscope.cli.main import main
from attnscope.errors import AttnscopeError
from attnscope.models import bundled_model_path
from attnscope.records.check_report import TOLERANCE, tolerance_for


def test_default_model_is_the_bundled_minilm(minilm: attnscope.Model) -> None:
    assert minilm.name == "all-MiniLM-L6-v2"
    assert (minilm.architecture, minilm.n_layers, minilm.n_heads) == ("BertModel", 6, 12)
    assert minilm.model.config._attn_implementation == "eager"
    assert attnscope.load_model() is minilm  # loaded once per process
    assert attnscope.load_model("sentence-transformers/all-MiniLM-L6-v2") is minilm


def test_a_local_checkpoint_directory_loads(minilm: attnscope.Model) -> None:
    m = attnscope.load_model(str(bundled_model_path()))
    assert m.name == str(bundled_model_path()) and m.n_layers == 6
    tr = attnscope.trace("hello world", model=m)
    assert tr.check().ok


def test_an_already_loaded_model_is_used_as_is(minilm: attnscope.Model) -> None:
    m = attnscope.load_model(minilm.model)
    assert m.model is minilm.model and m.tokenizer is not None


def test_a_directory_without_config_is_refused(tmp_path: Path) -> None:
    with pytest.raises(AttnscopeError, match=r"has no config\.json"):
        attnscope.load_model(str(tmp_path))


def test_unavailable_model_fails_fast_naming_it() -> None:
    code = ("import attnscope, attnscope.models, time\n"  # torch and transformers imported before the clock starts
            "t = time.time()\n"
            "try:\n"
            "    attnscope.load_model('no-such-org/no-such-model')\n"
            "except attnscope.AttnscopeError as e:\n"
            "    print(round(time.time() - t, 1), e)\n")
    start = time.time()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "no-such-org/no-such-model" in out.stdout and "not available offline" in out.stdout, out.stderr
    seconds = float(out.stdout.split()[0])
    assert seconds < 20, f"no retries: took {seconds}s in load_model (whole process {time.time() - start:.1f}s)"


# --- SmolLM2 from its GGUF file, the checkpoint cache, device and dtype ---

def test_smollm2_is_the_real_llama_decoder_with_its_lm_head(smollm2: attnscope.Model) -> None:
    assert (smollm2.architecture, smollm2.n_layers, smollm2.n_heads) == ("LlamaForCausalLM", 30, 9)
    assert smollm2.base.config.num_key_value_heads == 3 and type(smollm2.base).__name__ == "LlamaModel"
    assert smollm2.model.config._attn_implementation == "eager"
    assert attnscope.load_model("SmolLM2-135M-Instruct") is smollm2  # an alias, loaded once per process
    text = "The capital of France is"
    ids = smollm2.tokenizer(text, return_tensors="pt")
    assert smollm2.tokenizer.decode(ids["input_ids"][0]) == text
    with torch.no_grad():
        logits = smollm2.model(**ids).logits  # [batch, token, vocab]
    assert logits.shape[-1] == smollm2.model.config.vocab_size
    assert str(smollm2.tokenizer.decode(logits[0, -1].argmax())).strip() == "Paris"  # the dequantized weights know it


def test_smollm2_loads_from_the_cached_checkpoint(smollm2: attnscope.Model,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    gguf = gguf_cache.smollm2_gguf()
    with caplog.at_level(logging.DEBUG, logger="attnscope"):
        checkpoint = gguf_cache.checkpoint_for(gguf)
    assert not [r for r in caplog.records if "converting" in r.getMessage()]  # read, not converted again
    assert (checkpoint / gguf_cache.MANIFEST).is_file() and (checkpoint / "model.safetensors").is_file()
    assert Path(str(smollm2.model.name_or_path)) == checkpoint  # the model came from the cache
    assert checkpoint.is_relative_to(gguf_cache.cache_dir())


def test_the_cache_directory_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("ATTNSCOPE_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert gguf_cache.cache_dir() == tmp_path / "xdg" / "attnscope"
    monkeypatch.setenv("ATTNSCOPE_CACHE", str(tmp_path / "mine"))
    assert gguf_cache.cache_dir() == tmp_path / "mine"


def test_an_unwritable_cache_is_one_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("ATTNSCOPE_CACHE", str(blocker))
    with pytest.raises(AttnscopeError, match=r"cannot write the model cache .*ATTNSCOPE_CACHE"):
        gguf_cache.checkpoint_for(gguf_cache.smollm2_gguf())


@pytest.mark.parametrize(("content", "message"), [
    (None, r"no such file"),
    (b"GGML but not quite", r"is not a GGUF file"),
    ("truncated", r"cannot read the GGUF file .*truncated\.gguf"),
])
def test_a_missing_or_corrupt_gguf_is_one_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                content: bytes | str | None, message: str) -> None:
    monkeypatch.setenv("ATTNSCOPE_CACHE", str(tmp_path / "cache"))
    path = tmp_path / ("truncated.gguf" if content == "truncated" else "model.gguf")
    if content == "truncated":  # the real file cut after 1 MB: a valid start, then its metadata cut short
        with gguf_cache.smollm2_gguf().open("rb") as f:
            path.write_bytes(f.read(1_000_000))
    elif isinstance(content, bytes):
        path.write_bytes(content)
    with pytest.raises(AttnscopeError, match=message):
        attnscope.load_model(str(path))
    left = [p.name for p in (tmp_path / "cache").glob("gguf/*") if p.name != gguf_cache.LOCK]
    assert left == []  # no half-written checkpoint (nor an index record of it) left behind


# --- the cache shared by content: one checkpoint per GGUF content, stale ones removed ---

OLD_TRANSFORMERS, NEW_TRANSFORMERS = "4.0.0", "99.0.0"


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    """SmolLM2's GGUF copied to two paths (as two virtualenvs hold it), loaded from both into a cache that
    already holds what earlier runs leave: the same content by an older and a newer transformers, a copy
    named by path (attnscope before the index), damaged copies, conversions abandoned or in progress, and
    things that are not attnscope's. $ATTNSCOPE_CACHE points at it; $HOME and $XDG_CACHE_HOME at empty
    directories that must stay empty. One real conversion (~30-60 s) for the whole module."""
    tmp = tmp_path_factory.mktemp("shared-cache")
    original = gguf_cache.smollm2_gguf()
    first, second = tmp / "venv-a" / original.name, tmp / "venv-b" / "same-bytes.gguf"
    for copy in (first, second):
        copy.parent.mkdir()
        shutil.copyfile(original, copy)
    sha256 = hashlib.sha256(first.read_bytes()).hexdigest()
    cache, home, xdg = tmp / "cache", tmp / "home", tmp / "xdg"
    root = cache / "gguf"
    for d in (root, home, xdg):
        d.mkdir(parents=True)

    def checkpoint(name: str, manifest: dict[str, object] | str | None) -> Path:
        d = root / name
        d.mkdir()
        (d / "model.safetensors").write_bytes(b"not the real weights")
        if manifest is not None:
            text = manifest if isinstance(manifest, str) else json.dumps(manifest)
            (d / gguf_cache.MANIFEST).write_text(text)
        return d

    def manifest(sha: str, version: str | None) -> dict[str, object]:
        return {"gguf": "/tmp/tmp.gone/p/.venv/x.gguf", "size": first.stat().st_size, "sha256": sha,
                **({"transformers": version} if version else {})}

    other = "0" * 64
    made = {
        "older": checkpoint(gguf_cache.entry_name(sha256, OLD_TRANSFORMERS), manifest(sha256, OLD_TRANSFORMERS)),
        "by_path": checkpoint("SmolLM2-135M-Instruct.Q4_1-0123456789abcdef", manifest(sha256, None)),
        "newer": checkpoint(gguf_cache.entry_name(sha256, NEW_TRANSFORMERS), manifest(sha256, NEW_TRANSFORMERS)),
        "other_content": checkpoint(gguf_cache.entry_name(other, OLD_TRANSFORMERS), manifest(other, OLD_TRANSFORMERS)),
        "no_manifest": checkpoint(gguf_cache.entry_name(other, NEW_TRANSFORMERS), None),
        "cut_manifest": checkpoint(gguf_cache.entry_name("1" * 64, NEW_TRANSFORMERS), '{"gguf": "/tmp/x.gg'),
        "by_path_no_manifest": checkpoint("Other.Q8_0-fedcba9876543210", None),
        "not_ours": checkpoint("my notes", None),
    }
    for name in ("dead", "live", "fresh_lockless", "old_lockless"):
        d = root / f"{gguf_cache.CONVERTING}{name}"
        d.mkdir()
        (d / "model.safetensors").write_bytes(b"half")
        if name in ("dead", "live"):
            (d / gguf_cache.WRITING).write_text("")
        made[name] = d
    two_hours_ago = time.time() - 7200
    for p in (made["old_lockless"] / "model.safetensors", made["old_lockless"]):
        os.utime(p, (two_hours_ago, two_hours_ago))
    outside = tmp / "outside"  # a link in the cache to a directory elsewhere, which looks like a damaged checkpoint
    outside.mkdir()
    (outside / "keep.txt").write_text("not the cache's")
    made["link"] = root / gguf_cache.entry_name("2" * 64, NEW_TRANSFORMERS)
    made["link"].symlink_to(outside, target_is_directory=True)

    writer = subprocess.Popen(  # another process converting right now: it holds its .writing
        [sys.executable, "-c", "import fcntl, sys\nf = open(sys.argv[1], 'a')\nfcntl.flock(f, fcntl.LOCK_EX)\n"
         "print('locked', flush=True)\nsys.stdin.read()", str(made["live"] / gguf_cache.WRITING)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    messages: list[str] = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = lambda record: messages.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("attnscope.gguf_cache")
    level = logger.level
    try:
        assert writer.stdout is not None and writer.stdout.readline().strip() == "locked"
        logger.addHandler(handler)
        logger.setLevel(logging.DEBUG)
        with pytest.MonkeyPatch.context() as env:
            env.setenv("ATTNSCOPE_CACHE", str(cache))
            env.setenv("HOME", str(home))
            env.setenv("XDG_CACHE_HOME", str(xdg))
            from_first = gguf_cache.checkpoint_for(first)
            converted_first = [m for m in messages if m.startswith("converting ")]
            from_second = gguf_cache.checkpoint_for(second)
            converted_second = [m for m in messages if m.startswith("converting ")][len(converted_first):]
            model = attnscope.load_model(str(second))
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        assert writer.stdin is not None
        writer.stdin.close()  # the writer ends on its own
        writer.wait(timeout=60)
    yield SimpleNamespace(sha256=sha256, root=root, paths=(first, second), home=home, xdg=xdg, outside=outside,
                          made=made, first=from_first, second=from_second, model=model,
                          converted_first=converted_first, converted_second=converted_second)


def test_one_gguf_content_at_two_paths_is_one_checkpoint(shared_cache: SimpleNamespace) -> None:
    c = shared_cache
    assert c.first == c.second  # same bytes at another path (another virtualenv): the same checkpoint
    assert len(c.converted_first) == 1 and c.converted_second == []  # converted once, then read
    import transformers

    assert c.first == c.root / gguf_cache.entry_name(c.sha256, transformers.__version__)
    manifest = json.loads((c.first / gguf_cache.MANIFEST).read_text())
    assert manifest["sha256"] == c.sha256 and manifest["transformers"] == transformers.__version__
    ours = [p for p in c.root.iterdir() if not p.is_symlink() and p.is_dir() and p.name.startswith(c.sha256[:24])]
    assert sorted(p.name for p in ours) == sorted([c.first.name, c.made["newer"].name])
    assert Path(str(c.model.model.name_or_path)) == c.first  # the model loaded from the second path came from it
    assert c.model.n_layers == 30


def test_each_path_is_indexed_by_its_sha256_inside_attnscope_cache(shared_cache: SimpleNamespace) -> None:
    c = shared_cache
    records = [json.loads(p.read_text()) for p in (c.root / gguf_cache.INDEX).glob("*.json")]
    assert {r["gguf"]: r["sha256"] for r in records} == {str(p.resolve()): c.sha256 for p in c.paths}
    assert list(c.home.iterdir()) == [] and list(c.xdg.iterdir()) == []  # nothing outside $ATTNSCOPE_CACHE


def test_a_checkpoint_of_the_same_file_by_an_older_transformers_is_removed(shared_cache: SimpleNamespace) -> None:
    made = shared_cache.made
    assert not made["older"].exists()  # the same content by an older transformers
    assert not made["by_path"].exists()  # the same content named by path (the 26 copies of before)
    assert (made["newer"] / gguf_cache.MANIFEST).is_file()  # a newer transformers (another virtualenv) keeps its own
    assert (made["other_content"] / gguf_cache.MANIFEST).is_file()  # another file's checkpoint is not touched


def test_an_interrupted_conversion_is_removed_but_not_one_in_progress(shared_cache: SimpleNamespace) -> None:
    made = shared_cache.made
    for gone in ("no_manifest", "cut_manifest", "by_path_no_manifest", "dead", "old_lockless"):
        assert not made[gone].exists(), gone
    assert (made["live"] / "model.safetensors").is_file()  # its writer held .writing
    assert (made["fresh_lockless"] / "model.safetensors").is_file()  # maybe an older attnscope writing: too recent
    assert (made["not_ours"] / "model.safetensors").is_file()  # not a name attnscope gives
    assert made["link"].is_symlink() and (shared_cache.outside / "keep.txt").read_text() == "not the cache's"


@pytest.mark.parametrize(("options", "message"), [
    ({"dtype": "float64"}, r"dtype='float64' is not supported: use one of float32, bfloat16, float16"),
    ({"device": "tpu"}, r"device='tpu' is not supported"),
    ({"device": "cuda:x"}, r"device='cuda:x' is not supported"),
])
def test_unknown_dtype_or_device_is_one_error(options: dict[str, str], message: str) -> None:
    with pytest.raises(AttnscopeError, match=message) as err:
        attnscope.load_model(**options)  # type: ignore[arg-type]
    assert err.value.parameter in options


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA GPU is present here: no absent-device error")
def test_an_absent_gpu_is_one_error_on_the_cli(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "hello", "--device", "cuda"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--device 'cuda' is not available" in err, err


def test_unknown_dtype_on_the_cli_is_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["check", "hello", "--dtype", "float64"])
    assert exit_.value.code == 2 and "invalid choice: 'float64'" in capsys.readouterr().err


def test_a_loaded_model_in_another_dtype_is_a_moved_copy(minilm: attnscope.Model) -> None:
    half = attnscope.load_model(minilm, dtype="bfloat16")
    assert half is not minilm and half.dtype == torch.bfloat16 and minilm.dtype == torch.float32
    assert attnscope.load_model(minilm, dtype="float32", device="cpu") is minilm


def test_a_bfloat16_trace_passes_its_own_stated_tolerance() -> None:
    tr = attnscope.trace(["The quick brown fox jumps over the lazy dog.", "A short one."], dtype="bfloat16")
    report = tr[0].check()
    assert tr[0].model["dtype"] == "bfloat16" and report.tolerance == tolerance_for("bfloat16")
    assert tr[0].arrays["q"].dtype == np.float32  # the model's bfloat16 numbers, exactly, as float32
    assert report.ok, report.max_error
    assert report.max_error > TOLERANCE  # the model really ran in bfloat16: float32's tolerance would fail it
    assert not tr[0].check(TOLERANCE).ok


def test_tolerances_scale_with_each_dtypes_epsilon() -> None:
    assert tolerance_for("float32") == TOLERANCE == 1e-5
    assert tolerance_for("bfloat16") == pytest.approx(1e-5 * 2**16)  # epsilon 2^-7 against 2^-23
    assert tolerance_for("float16") == pytest.approx(1e-5 * 2**13)  # epsilon 2^-10
    with pytest.raises(AttnscopeError, match="no stated tolerance"):
        tolerance_for("float64")


@pytest.mark.parametrize("device", [
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU here")),
    pytest.param("mps", marks=pytest.mark.skipif(not torch.backends.mps.is_available(), reason="no Apple GPU here")),
])
def test_a_gpu_trace_checks_within_the_float32_tolerance(device: str) -> None:
    tr = attnscope.trace("The capital of France is Paris.", device=device)
    assert tr.model["device"].startswith(device) and tr.check().ok, tr.check().max_error


def test_explain_on_the_cli_in_bfloat16(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["explain", "time flies", "--dtype", "bfloat16", "--layer", "1", "--head", "2", "--format", "json"]
    assert main(args) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["check"]["tolerance"] == tolerance_for("bfloat16") and data["check"]["ok"]
