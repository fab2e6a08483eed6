"""Odd input found by probing the CLI as a careless user and an attacker would (issue 29): each gets one line
and exit 2, never a traceback; numbers are read in ASCII digits only, each within a stated range."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import attnscope
from attnscope.models import bundled_model_path
from attnscope.numbers import finite_or_null, is_count, parse_float, parse_int
from tests.support.cli import run


@pytest.mark.parametrize("args, message", [
    (["generate", "hi", "--temperature", "1e-300"], "--temperature 1e-300 is out of range"),
    (["generate", "hi", "--seed", "1180591620717411303424"], "--seed 1180591620717411303424 is out of range"),
    (["generate", "hi", "--seed", "-1"], "--seed -1 is out of range"),
    (["ablate", "hi there", "--heads", "².0"], "'².0' is not layer.head"),
    (["ablate", "hi there", "--heads", "cross:².0"], "'cross:².0' is not layer.head"),
    (["check", "hi", "--device", "cuda:²"], "'cuda:²' is not a device"),
    (["explain", "hi", "--layer", "٣"], "'٣' is not an integer"),
    (["explain", "hi", "--layer", "²"], "'²' is not an integer"),
    (["view", "hi", "-o", "w.png", "--width", "-5"], "--width -5 is out of range: use 320..7680"),
    (["view", "hi", "-o", "w.png", "--width", "0"], "--width 0 is out of range"),
    (["view", "hi", "-o", "w.png", "--width", "1000000000"], "--width 1000000000 is out of range"),
    (["check", "--text-file", "/dev/zero"], "over the limit of 10 MB for a text file"),
    (["check", "--text-file", "/dev/zero", "--max-text-mb", "0.5"], "over the limit of 0.5 MB"),
    (["explain", "hi there", "--step", "-1"], "--step -1 is out of range: steps are counted from 0"),
])
def test_odd_input_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch, args: list[str], message: str) -> None:
    monkeypatch.chdir(tmp_path)
    try:
        code, _, err = run(capsys, *args)
    except SystemExit as exc:  # argparse's own refusal of a value its type rejects
        code, err = int(exc.code or 0), capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1 and "Traceback" not in err, err


def test_a_damaged_checkpoint_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A truncated model.safetensors gets the loader's one line, as a damaged GGUF file does."""
    folder = tmp_path / "ckpt"
    shutil.copytree(bundled_model_path(), folder)
    with (folder / "model.safetensors").open("r+b") as f:
        f.truncate(1000)
    code, _, err = run(capsys, "check", "hi", "--model", str(folder))
    assert code == 2 and "weights file is damaged or truncated" in err and err.count("\n") == 1


def test_generate_refuses_a_family_it_cannot_verify(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                     minilm: attnscope.Model) -> None:
    """A random OPT (no adapter): generate says NOT VERIFIED in one line, as check does, not ZeroDivisionError."""
    from transformers import OPTConfig, OPTForCausalLM

    cfg = OPTConfig(vocab_size=minilm.tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, ffn_dim=64,
                    num_attention_heads=2, max_position_embeddings=64, word_embed_proj_dim=32)
    OPTForCausalLM(cfg).save_pretrained(tmp_path)
    minilm.tokenizer.save_pretrained(tmp_path)
    code, _, err = run(capsys, "generate", "hello there", "--model", str(tmp_path), "--max-new-tokens", "3")
    assert code == 2 and err.startswith("attnscope: error: NOT VERIFIED: no attnscope adapter for model type 'opt'")
    assert err.count("\n") == 1


def test_pair_is_refused_on_an_encoder_decoder(capsys: pytest.CaptureFixture[str], t5_dir: str) -> None:
    for command in ("check", "trace", "explain"):
        extra = ["-o", "/tmp/unused.safetensors"] if command == "trace" else []
        code, _, err = run(capsys, command, "the cat", "--target", "die katze", "--pair", "b", "--model", t5_dir,
                           *extra)
        assert code == 2 and "--pair is a second sentence for an encoder" in err and err.count("\n") == 1


def test_resume_advice_speaks_flags(capsys: pytest.CaptureFixture[str], tmp_path: Path, ud_dev: Path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "x").write_text("taken", encoding="utf-8")
    code, _, err = run(capsys, "stats", str(ud_dev), "-o", str(tmp_path / "out"), "--limit", "2")
    assert code == 2 and "pass --resume to continue" in err and "resume=True" not in err


def test_json_is_strict() -> None:
    """NaN and infinities become null in every --format json answer; json.loads in strict mode reads it."""
    body = {"a": float("nan"), "b": [1.0, float("inf")], "c": {"d": -float("inf")}, "e": 2}
    text = json.dumps(finite_or_null(body), allow_nan=False)
    assert json.loads(text) == {"a": None, "b": [1.0, None], "c": {"d": None}, "e": 2}


def test_one_number_reader() -> None:
    assert [is_count(s) for s in ("12", "²", "٣", "", "-1")] == [True, False, False, False, False]
    assert parse_int(" -12 ") == -12 and parse_float("1e-3") == 1e-3 and parse_float("inf") == float("inf")
    for bad in ("²", "٣", "1_000", "0x10", ""):
        with pytest.raises(ValueError, match="is not an integer"):
            parse_int(bad)
    with pytest.raises(ValueError, match="is not a number"):
        parse_float("٣.5")


def test_the_max_length_default_fits_the_model(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                               minilm: attnscope.Model) -> None:
    """A BART that reads 128 positions: check and trace work without --max-length (the default is the smaller
    of 256 and its positions, for the source and the target); naming 256 is still refused in one line."""
    import torch
    import transformers as T

    torch.manual_seed(0)
    cfg = T.BartConfig(d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                       decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=128,
                       vocab_size=30522, pad_token_id=0, bos_token_id=101, eos_token_id=102)
    T.BartForConditionalGeneration(cfg).save_pretrained(tmp_path)
    minilm.tokenizer.save_pretrained(tmp_path)
    code, out, err = run(capsys, "check", "the cat sat", "--target", "die katze", "--model", str(tmp_path))
    assert code == 0 and "PASS" in out, err
    tr = attnscope.trace_seq2seq("the cat sat", "die katze", model=str(tmp_path))
    assert tr.status() == "PASS"
    code, _, err = run(capsys, "check", "the cat sat", "--target", "die katze", "--model", str(tmp_path),
                       "--max-length", "256")
    assert code == 2 and "--max-length 256 exceeds what" in err and "(128 positions)" in err
