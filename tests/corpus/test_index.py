"""The index build: its numbers are the model's own, its labels UD's, and a build killed with SIGKILL and resumed
writes the same bytes as one that was never stopped."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import attnscope
from attnscope.corpus.index import CHECKPOINT, BuildResult, build_index
from attnscope.corpus.store import MANIFEST, CorpusIndex
from attnscope.corpus.tags import TaggedSource
from attnscope.errors import AttnscopeError
from attnscope.stats.settings import Settings
from tests.support.corpus import DOCUMENTS, HEADS, LAYERS, cli

TOLERANCE = 1e-5  # float32: the same sentence alone and inside a padded batch


def _rows_of(index: CorpusIndex, doc: int) -> np.ndarray:
    return np.flatnonzero(np.asarray(index.columns["doc"]) == doc)


@pytest.mark.parametrize("doc", [0, 17])
def test_stored_vectors_are_the_models_own(index: CorpusIndex, minilm: attnscope.Model, doc: int) -> None:
    text = index.document(doc)["text"]
    rows = _rows_of(index, doc)
    trace = attnscope.trace(text, model=minilm)
    assert len(rows) == len(trace.tokens)
    enc = minilm.tokenizer(text, return_tensors="pt")
    with torch.no_grad():
        hidden = minilm.model(**enc, output_hidden_states=True).hidden_states  # the model's own, no capture
    special = np.array([t.special for t in trace.tokens])
    for layer in LAYERS:
        emb = np.asarray(index.array(f"embedding.l{layer}"))[rows]
        assert np.abs(emb - hidden[layer + 1][0].numpy()).max() <= TOLERANCE
        q, k, w = (trace.arrays[s][layer][list(HEADS)] for s in ("q", "k", "weights"))  # [head, token, ...]
        assert np.abs(np.asarray(index.array(f"query.l{layer}"))[rows] - q.transpose(1, 0, 2)).max() <= TOLERANCE
        assert np.abs(np.asarray(index.array(f"key.l{layer}"))[rows] - k.transpose(1, 0, 2)).max() <= TOLERANCE
        context = trace.arrays["context"][layer].transpose(1, 0, 2).reshape(len(rows), -1)  # [token, head * d_head]
        assert np.abs(np.asarray(index.array(f"context.l{layer}"))[rows] - context).max() <= TOLERANCE
        entropy = -(w * np.log(np.where(w > 0, w, 1.0))).sum(-1).T  # [token, head], by the definition
        assert np.abs(np.asarray(index.array(f"entropy.l{layer}"))[rows] - entropy).max() <= TOLERANCE
        share = w[:, :, special].sum(-1).T
        assert np.abs(np.asarray(index.array(f"special_share.l{layer}"))[rows] - share).max() <= TOLERANCE
        top = w.argmax(-1).T - np.arange(len(rows))[:, None]
        assert (np.asarray(index.array(f"top_offset.l{layer}"))[rows] == top).mean() > 0.99  # near-ties may flip


def test_tokens_carry_their_place_and_ud_labels(index: CorpusIndex, ud_dev: Path) -> None:
    # sentence 0 of the slice: "From the AP comes this story :" (UPOS ADP DET PROPN VERB DET NOUN PUNCT)
    first = next(i for i in range(index.n_documents) if index.document(i)["number"] == 0)
    assert index.document(first)["where"] == f"{ud_dev}:5"
    rows = _rows_of(index, first)
    cols = {k: np.asarray(v)[rows] for k, v in index.columns.items()}
    text = index.document(first)["text"]
    assert [text[a:b] for a, b in zip(cols["start"], cols["end"], strict=True)] == \
        ["", "From", "the", "AP", "comes", "this", "story", ":", ""]
    assert cols["special"].tolist() == [1, 0, 0, 0, 0, 0, 0, 0, 1] and cols["position"].tolist() == list(range(9))
    upos, deprel = index.vocab["upos"], index.vocab["deprel"]
    assert [upos[c] if c >= 0 else None for c in cols["upos"]] == \
        [None, "ADP", "DET", "PROPN", "VERB", "DET", "NOUN", "PUNCT", None]
    assert [deprel[c] if c >= 0 else None for c in cols["deprel"]] == \
        [None, "case", "det", "obl", "root", "det", "nsubj", "punct", None]
    assert index.n_documents == DOCUMENTS and sorted(index.document(i)["number"] for i in range(DOCUMENTS)) == \
        list(range(DOCUMENTS))


def test_the_manifest_names_model_layers_heads_corpus_and_checksums(built: BuildResult, index: CorpusIndex) -> None:
    manifest = index.manifest
    assert manifest["model"]["name"] == "all-MiniLM-L6-v2" and manifest["layers"] == [0, 3]
    assert manifest["heads"] == [1, 4] and manifest["corpus"]["documents"] == DOCUMENTS
    assert manifest["corpus"]["tokens"] == built.tokens == index.n_tokens
    assert all(len(e["sha256"]) == 64 for e in manifest["arrays"].values())
    assert index.array("query.l3").shape == (built.tokens, 2, 32)
    assert manifest["ann"]["library"] == "faiss" and set(manifest["ann"]["files"]) == {
        "embedding.l0", "embedding.l3", "context.l0", "context.l3"}


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != CHECKPOINT}


def test_a_build_killed_with_sigkill_and_resumed_equals_an_uninterrupted_one(
        ud_dev: Path, tmp_path: Path, minilm: attnscope.Model) -> None:
    args = ["--limit", "24", "--batch-size", "4", "--checkpoint-every", "1", "--layers", "0,3", "--heads", "1,4",
            "--ann", "none", "--format", "json"]
    out = tmp_path / "killed"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cli("index", str(ud_dev), "-o", str(out), *args), env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None and _documents(out) < 8:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    checkpoint = json.loads((out / CHECKPOINT).read_text(encoding="utf-8"))
    assert not checkpoint["complete"] and 0 < checkpoint["documents"] < 24, "the build ended before it was killed"
    assert not (out / MANIFEST).exists()
    with pytest.raises(AttnscopeError, match="its build did not finish: run attnscope index again with --resume"):
        CorpusIndex(out)
    resumed = subprocess.run(cli("index", str(ud_dev), "-o", str(out), "--resume", *args), env=env,
                             capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    assert 0 < json.loads(resumed.stdout)["resumed_from_documents"] < 24
    whole = build_index(TaggedSource(str(ud_dev)), tmp_path / "whole", minilm, layers=LAYERS, heads=HEADS,
                        settings=Settings(limit=24, batch_size=4), ann=())
    assert _files(out) == _files(whole.path)  # every array, documents.jsonl and the manifest, byte for byte


def _documents(out: Path) -> int:
    try:
        return int(json.loads((out / CHECKPOINT).read_text(encoding="utf-8"))["documents"])
    except (OSError, ValueError, KeyError):
        return 0


def test_resume_with_other_layers_is_refused_naming_the_difference(
        ud_dev: Path, tmp_path: Path, minilm: attnscope.Model) -> None:
    out = tmp_path / "index"
    settings = Settings(limit=8, batch_size=4)
    build_index(TaggedSource(str(ud_dev)), out, minilm, layers=[0], heads=[0], settings=settings, ann=())
    before = _files(out)
    with pytest.raises(AttnscopeError, match=r"other arguments \(layers \[0\] -> \[0, 3\]\)"):
        build_index(TaggedSource(str(ud_dev)), out, minilm, layers=[0, 3], heads=[0], settings=settings, ann=(),
                    resume=True)
    with pytest.raises(AttnscopeError, match="already exists and is not empty: pass resume=True"):
        build_index(TaggedSource(str(ud_dev)), out, minilm, layers=[0], heads=[0], settings=settings, ann=())
    again = build_index(TaggedSource(str(ud_dev)), out, minilm, layers=[0], heads=[0], settings=settings, ann=(),
                        resume=True)  # a complete build: nothing to do
    assert again.resumed_from == again.documents == 8 and again.seconds == 0.0
    assert _files(out) == before


def test_layers_and_heads_out_of_range_are_refused(ud_dev: Path, tmp_path: Path, minilm: attnscope.Model) -> None:
    with pytest.raises(AttnscopeError, match=r"layer 6 is out of range: all-MiniLM-L6-v2 has 6 layers, valid values "
                                             r"are 0\.\.5"):
        build_index(TaggedSource(str(ud_dev)), tmp_path / "a", minilm, layers=[6])
    with pytest.raises(AttnscopeError, match=r"head 12 is out of range"):
        build_index(TaggedSource(str(ud_dev)), tmp_path / "b", minilm, heads=[0, 12])
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
