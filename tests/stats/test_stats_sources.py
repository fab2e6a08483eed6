"""Corpus readers on real files of each format, malformed rows reported with file:line."""

from __future__ import annotations

import itertools
import json
import logging
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from attnscope.errors import AttnscopeError
from attnscope.stats.sources import Source

CONLLU = """# sent_id = 1
# text = I don't know.
1	I	I	PRON	PRP	_	4	nsubj	_	_
2-3	don't	_	_	_	_	_	_	_	_
2	do	do	AUX	VBP	_	4	aux	_	_
3	n't	not	PART	RB	_	4	advmod	_	_
3.1	know	know	VERB	VB	_	_	_	_	_
4	know	know	VERB	VB	_	0	root	_	_
5	.	.	PUNCT	.	_	4	punct	_	_

# sent_id = 2
1	Broken	x	X	X	_	0
2	line	x	X	X	_	1	dep	_	_

1	Fine	fine	ADJ	JJ	_	0	root	_	_
"""


def texts(source: Source) -> list[str]:
    return [d.text for d in source]


def test_plain_text_is_one_document_per_line(tmp_path: Path) -> None:
    f = tmp_path / "c.txt"
    f.write_text("first line\n\n  \nsecond line\n", encoding="utf-8")
    docs = list(Source(str(f)))
    assert [d.text for d in docs] == ["first line", "second line"]
    assert docs[1].where == f"{f}:4"


def test_jsonl_reports_bad_rows_with_line_numbers(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    f = tmp_path / "c.jsonl"
    f.write_text('{"body": "one"}\n{not json}\n{"other": 1}\n{"body": "two"}\n', encoding="utf-8")
    src = Source(str(f), field="body")
    with caplog.at_level(logging.WARNING):
        assert texts(src) == ["one", "two"]
    assert src.malformed == 2
    assert f"{f}:2: not valid JSON" in caplog.text and f"{f}:3: field 'body' is missing" in caplog.text
    with pytest.raises(AttnscopeError, match=r"c\.jsonl:2: not valid JSON.*\(strict=True makes malformed rows fatal\)"):
        list(Source(str(f), field="body", strict=True))


def test_csv_and_tsv_columns(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    f = tmp_path / "c.csv"
    f.write_text('id,text\n1,"hello, world"\n2\n3,bye\n', encoding="utf-8")
    src = Source(str(f))
    with caplog.at_level(logging.WARNING):
        assert texts(src) == ["hello, world", "bye"]
    assert f"{f}:3: 1 fields where the header has 2" in caplog.text
    t = tmp_path / "c.tsv"
    t.write_text("a\tb\nx\ty\n", encoding="utf-8")
    assert texts(Source(str(t), column="b")) == ["y"]
    with pytest.raises(AttnscopeError, match="choose one with column=NAME"):
        list(Source(str(t)))
    with pytest.raises(AttnscopeError, match="has no column 'c'"):
        list(Source(str(t), column="c"))


def test_parquet_and_directory(tmp_path: Path) -> None:
    f = tmp_path / "c.parquet"
    pq.write_table(pa.table({"n": [1, 2, 3], "body": ["a b", None, "c d"]}), f)
    src = Source(str(f), column="body")
    assert texts(src) == ["a b", "c d"] and src.malformed == 1
    d = tmp_path / "docs"
    d.mkdir()
    (d / "b.txt").write_text("second file", encoding="utf-8")
    (d / "a.txt").write_text("first file\nstill first", encoding="utf-8")
    (d / "c.txt").write_bytes(b"\xff\xfe bad")
    src = Source(str(d))
    assert texts(src) == ["first file\nstill first", "second file"] and src.malformed == 1


def test_conllu_skips_ranges_and_empty_nodes_and_bad_sentences(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    f = tmp_path / "c.conllu"
    f.write_text(CONLLU, encoding="utf-8")
    src = Source(str(f))
    with caplog.at_level(logging.WARNING):
        docs = list(src)
    assert src.malformed == 1
    assert f"{f}:12: 7 tab-separated fields, CoNLL-U has 10; sentence skipped" in caplog.text
    assert [d.text for d in docs] == ["I do n't know .", "Fine"]
    first = docs[0]
    assert first.words == ("I", "do", "n't", "know", ".")
    assert first.heads == (4, 4, 4, 0, 4) and first.relations == ("nsubj", "aux", "advmod", "root", "punct")
    assert first.where == f"{f}:3"


def test_the_real_ud_dev_slice_reads_completely(ud_dev: Path) -> None:
    src = Source(str(ud_dev))
    docs = list(itertools.islice(src, 5))
    assert docs[0].words == ("From", "the", "AP", "comes", "this", "story", ":")
    assert docs[0].heads == (3, 3, 4, 0, 6, 4, 4)
    assert src.count() == 500 and src.malformed == 0


def test_unknown_sources_fail_with_what_is_accepted(tmp_path: Path) -> None:
    with pytest.raises(AttnscopeError, match="does not exist"):
        Source(str(tmp_path / "missing.txt"))
    with pytest.raises(AttnscopeError, match="sklearn:20newsgroups"):
        Source("sklearn:mnist")


def test_newsgroups_offline_fails_fast(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Here the download server is unreachable: a clear error within seconds (with network: documents)."""
    monkeypatch.setenv("SCIKIT_LEARN_DATA", str(tmp_path))
    started = time.perf_counter()
    try:
        first = next(iter(Source("sklearn:20newsgroups:test")))
    except AttnscopeError as exc:
        assert "cannot be reached" in str(exc) or "could not download" in str(exc)
        assert time.perf_counter() - started < 15
    else:
        assert first.text.strip()


def test_json_field_defaults_to_text(tmp_path: Path) -> None:
    f = tmp_path / "c.jsonl"
    f.write_text(json.dumps({"text": "default field"}) + "\n", encoding="utf-8")
    assert texts(Source(str(f))) == ["default field"]


@pytest.mark.parametrize(("suffix", "header", "bad_line"), [(".txt", b"", 3001), (".csv", b"id,text\n", 3002)])
def test_a_non_utf8_line_far_into_a_file_is_named_exactly(tmp_path: Path, suffix: str, header: bytes,
                                                         bad_line: int) -> None:
    # Far past the text decoder's 8 KiB chunks, which used to name the chunk's line, not the byte's.
    f = tmp_path / f"corpus{suffix}"
    f.write_bytes(header + b"".join(b"%d,line %d\n" % (i, i) for i in range(3000)) + b"9,caf\xe9\n")
    with pytest.raises(AttnscopeError, match=rf"^{f}:{bad_line}: not UTF-8 text \(re-save the file as UTF-8\)$"):
        list(Source(str(f)))


def test_line_endings_are_those_of_text_mode(tmp_path: Path) -> None:
    f = tmp_path / "corpus.txt"
    f.write_bytes(b"one\r\ntwo\rthree\n\nfour\r")
    assert [(d.text, d.where) for d in Source(str(f))] == [
        ("one", f"{f}:1"), ("two", f"{f}:2"), ("three", f"{f}:3"), ("four", f"{f}:5")]
    f.write_bytes(b"one\r\ntwo\rbad \xff\n")
    with pytest.raises(AttnscopeError, match=rf"^{f}:3: not UTF-8"):
        list(Source(str(f)))
