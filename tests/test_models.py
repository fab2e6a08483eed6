"""Loading models: the bundled default, local checkpoints, loaded objects, and fast offline failure."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import attnscope
from attnscope import gguf_cache
from attnscope.cli.main import main
from attnscope.errors import AttnscopeError
from attnscope.models import bundled_model_path
from attnscope.report import TOLERANCE, tolerance_for


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
    assert not list((tmp_path / "cache").glob("gguf/*"))  # no half-written checkpoint left behind


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
