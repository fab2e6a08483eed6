"""Saved traces: every array, token and the verification survive a round trip."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open

import attnscope
from attnscope.errors import AttnscopeError
from attnscope.stages import ARRAY_AXES


@pytest.fixture(scope="module")
def pair_trace(minilm: attnscope.Model) -> attnscope.Trace:
    return attnscope.trace("The cat sat.", "It was <b>happy</b>.", model=minilm)


@pytest.mark.parametrize("suffix", [".safetensors", ".npz"])
def test_round_trip(pair_trace: attnscope.Trace, tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"t{suffix}"
    pair_trace.save(path)
    loaded = attnscope.Trace.load(path)
    assert loaded.text == pair_trace.text and loaded.pair == pair_trace.pair
    assert loaded.tokens == pair_trace.tokens
    assert loaded.model == pair_trace.model
    for stage, arr in pair_trace.arrays.items():
        assert np.array_equal(loaded.arrays[stage], arr), stage
        assert arr.ndim == len(ARRAY_AXES[stage])
    report = loaded.check()
    assert report.ok and report.max_error == pytest.approx(pair_trace.check().max_error)


def test_safetensors_names_and_metadata(pair_trace: attnscope.Trace, tmp_path: Path) -> None:
    path = tmp_path / "t.safetensors"
    pair_trace.save(path)
    with safe_open(str(path), framework="numpy") as f:
        names = set(f.keys())
        meta = json.loads(f.metadata()["attnscope"])
        ids = f.get_tensor("input_ids")
    assert {"x", "q", "k", "v", "scores", "weights", "context", "output", "input_ids"} <= names
    assert ids.tolist() == [t.id for t in pair_trace.tokens]
    assert meta["model"]["name"] == "all-MiniLM-L6-v2" and meta["text"] == "The cat sat."
    assert meta["axes"]["weights"] == ["layer", "head", "query", "key"]


def test_npz_holds_token_strings(pair_trace: attnscope.Trace, tmp_path: Path) -> None:
    path = tmp_path / "t.npz"
    pair_trace.save(path)
    with np.load(path) as z:
        assert z["tokens"].tolist() == pair_trace.token_strings


def test_bad_paths_give_clear_errors(pair_trace: attnscope.Trace, tmp_path: Path) -> None:
    with pytest.raises(AttnscopeError, match=r"use a \.safetensors or \.npz"):
        pair_trace.save(tmp_path / "t.json")
    with pytest.raises(AttnscopeError, match="cannot write"):
        pair_trace.save(tmp_path / "missing-dir" / "t.npz")
    with pytest.raises(AttnscopeError, match="cannot read"):
        attnscope.Trace.load(tmp_path / "absent.safetensors")
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"not a zip file")
    with pytest.raises(AttnscopeError):
        attnscope.Trace.load(junk)


@pytest.mark.parametrize(("name", "content", "why"), [
    ("junk.safetensors", b"not a safetensors file", "not a readable .safetensors file"),
    ("empty.safetensors", b"", "not a readable .safetensors file"),
    ("junk.npz", b"not a zip file", "not a .npz archive"),
    ("array.npz", None, "a single array, not a .npz archive"),
])
def test_damaged_files_give_one_line(tmp_path: Path, name: str, content: bytes | None, why: str) -> None:
    from attnscope.records.generation import load_generation

    path = tmp_path / name
    if content is None:
        with path.open("wb") as f:
            np.save(f, np.zeros(3))  # a .npy array under an .npz name
    else:
        path.write_bytes(content)
    for load in (attnscope.Trace.load, load_generation):
        with pytest.raises(AttnscopeError) as caught:
            load(path)
        message = str(caught.value)
        assert message == f"{path} is not an attnscope trace: {why}" or message.startswith(f"{path} is not an "
                                                                                          f"attnscope trace: {why} (")
        assert "pickle" not in message and "\n" not in message
