"""Ray Data reads text, .jsonl and .parquet corpora into exactly the Documents attnscope's own readers give."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import attnscope
from attnscope.stats import Settings, Source, run
from attnscope.stats.distributed import reading
from attnscope.stats.distributed import run as run_ray

pytestmark = pytest.mark.usefixtures("ray_runtime")


def both(source: Source) -> tuple[list[Any], int, list[Any], int]:
    local = list(source)
    local_bad = source.malformed
    ray_docs = list(reading.documents(source))
    return local, local_bad, ray_docs, source.malformed


def test_text_lines_split_as_python_does(tmp_path: Path) -> None:
    path = tmp_path / "corpus.txt"
    # \r\n, a lone \r, blank and blank-looking lines; a form feed and U+2028 stay inside their line
    path.write_bytes("one\r\ntwo\x0cthree\u2028four\n\n  \t\nfive\rsix\nlast".encode())
    local, _, ray_docs, _ = both(Source(str(path)))
    assert [d.text for d in ray_docs] == ["one", "two\x0cthree\u2028four", "five", "six", "last"]
    assert ray_docs == local  # texts and file:line places


def test_jsonl_malformed_rows_reported_like_the_local_reader(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "corpus.jsonl"
    rows = ['{"body": "a"}', "", '{"body": ""}', "not json", '{"x": 1}', '{"body": "b\u2028c"}', "[1]",
            '{"body": 7}']
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    local, local_bad, ray_docs, ray_bad = both(Source(str(path), field="body"))
    assert ray_docs == local and [d.text for d in local] == ["a", "b\u2028c"]
    assert ray_bad == local_bad == 5
    assert f"{path}:4: not valid JSON" in caplog.text


def test_parquet_column_values_and_rows(tmp_path: Path) -> None:
    path = tmp_path / "corpus.parquet"
    pq.write_table(pa.table({"id": [1, 2, 3, 4, 5], "body": ["first", None, " ", "fourth", "fifth"]}), path,
                   row_group_size=2)
    local, local_bad, ray_docs, ray_bad = both(Source(str(path), column="body"))
    assert ray_docs == local and [d.where[-5:] for d in ray_docs] == ["row 1", "row 4", "row 5"]
    assert ray_bad == local_bad == 2
    numbers = tmp_path / "numbers.parquet"
    pq.write_table(pa.table({"n": [1, 2]}), numbers)
    local, local_bad, ray_docs, ray_bad = both(Source(str(numbers)))
    assert ray_docs == local == [] and ray_bad == local_bad == 2


def test_strict_stops_at_the_same_row(tmp_path: Path) -> None:
    path = tmp_path / "corpus.jsonl"
    path.write_text('{"text": "fine"}\n{"text": 3}\n', encoding="utf-8")
    with pytest.raises(attnscope.AttnscopeError) as local_error:
        list(Source(str(path), strict=True))
    with pytest.raises(attnscope.AttnscopeError) as ray_error:
        list(reading.documents(Source(str(path), strict=True)))
    assert str(ray_error.value) == str(local_error.value)


def test_not_utf8_is_one_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "corpus.txt"
    path.write_bytes(b"fine\n" * 3000 + b"bad \xff byte\n")  # past the first read of the stream
    with pytest.raises(attnscope.AttnscopeError) as local_error:
        list(Source(str(path)))
    with pytest.raises(attnscope.AttnscopeError) as ray_error:
        list(reading.documents(Source(str(path))))
    assert str(ray_error.value) == str(local_error.value) == f"{path}:3001: not UTF-8 text (re-save the file as UTF-8)"


def test_jsonl_corpus_on_ray_equals_local(minilm: attnscope.Model, ud_dev: Path, tmp_path: Path) -> None:
    """UD sentences as a .jsonl corpus: read by Ray Data, computed on 2 workers, equal to the local engine."""
    sentences = [d.text for d, _ in zip(Source(str(ud_dev)), range(60), strict=False)]
    path = tmp_path / "ud.jsonl"
    path.write_text("".join(json.dumps({"text": s}) + "\n" for s in sentences), encoding="utf-8")
    settings = Settings(batch_size=8, chunk_batches=2, word_level=True)
    local = run(Source(str(path)), minilm, settings, tmp_path / "local")
    on_ray = run_ray(Source(str(path)), minilm, settings, tmp_path / "ray", workers=2, threads=1)
    assert on_ray.state.documents == 60
    assert on_ray.state.to_dict() == local.state.to_dict()
