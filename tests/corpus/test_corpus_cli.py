"""attnscope index and attnscope search end to end: the report a person reads, and bad input as one line, exit 2,
with the index left as it was."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import attnscope
from attnscope.corpus.index import BuildResult
from tests.support.cli import run, saved

QUERY = "The company bought a small bank ."  # token 2 is "company"


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _one_line_error(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    try:
        code, out, err = run(capsys, *args)
    except SystemExit as exc:  # argparse's own refusals end the parse
        code, captured = exc.code, capsys.readouterr()
        out, err = captured.out, captured.err
    assert code == 2 and out == "" and err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_search_shows_each_match_in_its_sentence_with_its_distance_and_a_summary(
        built: BuildResult, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "search", str(built.path), QUERY, "--token", "2", "--layer", "3", "-k", "12")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("12 tokens nearest to token 2 'company' of 'The company bought a small bank .' by "
                               "embedding at layer 3 (0-indexed; cosine distance; approximate (faiss))")
    first = lines[1]
    assert first.startswith(" 0  0.") and "[[company]]" in first and "NOUN" in first and "position" in first
    assert sum("[[" in line for line in lines) == 12
    for title in ("Summary of the 12 matches", "UD part of speech:", "UD dependency relation:",
                  "token position (0-indexed):"):
        assert any(title in line for line in lines), title
    assert any(line.split()[:1] == ["NOUN"] and line.rstrip().endswith("#") for line in lines)


def test_search_json_is_the_library_result(built: BuildResult, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "search", str(built.path), QUERY, "--token", "2", "--layer", "0", "--by", "query",
                       "--head", "4", "-k", "5", "--exact", "--format", "json")
    data = json.loads(out)
    assert code == 0 and data["method"] == "exact" and data["head"] == 4 and len(data["matches"]) == 5
    m = data["matches"][0]
    assert m["text"][m["start"]:m["end"]] == m["token"] and sum(data["summary"]["position"].values()) == 5


def test_index_reports_what_it_built_and_its_json(ud_dev: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "index", str(ud_dev), "-o", str(tmp_path / "i"), "--limit", "6", "--layers", "2-3",
                         "--heads", "0", "--ann", "embedding")
    assert code == 0, err
    assert out.startswith("6 documents, ") and "0 malformed rows skipped" in out and f"Index: {tmp_path / 'i'}" in out
    manifest = json.loads((tmp_path / "i" / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["layers"] == [2, 3] and manifest["heads"] == [0]
    assert set(manifest["ann"]["files"]) == {"embedding.l2", "embedding.l3"}


def test_an_index_of_another_model_is_refused_naming_both(built: BuildResult, minilm: attnscope.Model,
                                                          tmp_path_factory: pytest.TempPathFactory,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    other = saved(minilm, tmp_path_factory, "other-model")  # the same weights under another name: another model
    before = _files(built.path)
    err = _one_line_error(capsys, "search", str(built.path), QUERY, "--token", "2", "--layer", "3",
                          "--model", other)
    assert f"{built.path} was built with all-MiniLM-L6-v2, not {other}: search it with --model " \
           "all-MiniLM-L6-v2, or build an index with" in err
    assert _files(built.path) == before


@pytest.mark.parametrize(("args", "message"), [
    (["--layer", "4"], "holds layers 0, 3 (0-indexed), not --layer 4: search one of those"),
    (["--layer", "3", "--by", "key", "--head", "2"], "holds the q and k of heads 1, 4 (0-indexed), not --head 2"),
    (["--layer", "3", "--by", "query"], "--by query compares per-head vectors: give --head H, one of 1, 4"),
    (["--layer", "3", "--head", "1"], "--by embedding compares whole-layer vectors: --head 1 applies to"),
    (["--layer", "3", "--token", "40"], "token 40 is out of range: the query text has 9 tokens, valid values are "
                                        "0..8 (0-indexed, special tokens included)"),
    (["--layer", "3", "-k", "0"], "-k 0 must be at least 1"),
])
def test_a_query_the_index_cannot_answer_is_one_line(built: BuildResult, capsys: pytest.CaptureFixture[str],
                                                     args: list[str], message: str) -> None:
    token = [] if "--token" in args else ["--token", "2"]
    err = _one_line_error(capsys, "search", str(built.path), QUERY, *token, *args)
    assert message in err


def _copy(built: BuildResult, tmp_path: Path) -> Path:
    out = tmp_path / "copy"
    shutil.copytree(built.path, out)
    return out


@pytest.mark.parametrize("damage", ["flipped", "truncated", "manifest", "no manifest"])
def test_a_corrupt_or_truncated_index_is_one_line(built: BuildResult, tmp_path: Path, damage: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    out = _copy(built, tmp_path)
    target = out / "arrays" / "embedding.l3.bin"
    if damage == "flipped":
        data = bytearray(target.read_bytes())
        data[1000] ^= 0x40
        target.write_bytes(bytes(data))
    elif damage == "truncated":
        target.write_bytes(target.read_bytes()[:-4])
    elif damage == "manifest":
        manifest = out / "manifest.json"
        manifest.write_text(manifest.read_text(encoding="utf-8").replace('"tokens": ', '"tokens": 1'), encoding="utf-8")
    else:
        (out / "manifest.json").unlink()
    err = _one_line_error(capsys, "search", str(out), QUERY, "--token", "2", "--layer", "3", "--exact")
    expected = {"flipped": "embedding.l3.bin does not match the sha256 in", "truncated": "the index is truncated",
                "manifest": "does not match its own checksum", "no manifest": "is not a corpus index"}[damage]
    assert expected in err


def test_malformed_corpus_rows_are_skipped_and_counted_or_fatal_with_strict(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"text": "The first sentence."}\n{not json\n{"text": 3}\n{"text": "The last one."}\n',
                      encoding="utf-8")
    code, out, err = run(capsys, "index", str(corpus), "-o", str(tmp_path / "i"), "--layers", "0", "--heads", "0")
    assert code == 0 and out.startswith("2 documents, ") and "2 malformed rows skipped" in out
    assert f"{corpus}:2: not valid JSON" in err and f"{corpus}:3: field 'text' is missing or not a string" in err
    for quiet in ([], ["--no-progress"]):  # met by the bar's count, or by the pass itself: in flag words either way
        err = _one_line_error(capsys, "index", str(corpus), "-o", str(tmp_path / "j"), "--strict", *quiet)
        assert f"{corpus}:2: not valid JSON" in err and "(--strict makes malformed rows fatal)" in err


def test_an_existing_index_is_not_overwritten_and_bad_lists_are_refused(
        built: BuildResult, ud_dev: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = _files(built.path)
    err = _one_line_error(capsys, "index", str(ud_dev), "-o", str(built.path), "--limit", "2")
    assert "already exists and is not empty: pass --resume to continue that build" in err
    assert _files(built.path) == before
    err = _one_line_error(capsys, "index", str(ud_dev), "-o", str(tmp_path / "x"), "--layers", "3-1")
    assert "the range 3-1 runs backwards: write 1-3" in err
    err = _one_line_error(capsys, "index", str(ud_dev), "-o", str(tmp_path / "x"), "--layers", "7")
    assert "layer 7 is out of range" in err
