"""One read ladder (errors.read_path) behind every user file read: a text file for the CLI, a GGUF file."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnscope.cli.common import read_text_file
from attnscope.errors import AttnscopeError
from attnscope.gguf_cache import validate_gguf


def test_each_unreadable_file_is_one_line_naming_it(tmp_path: Path) -> None:
    latin = tmp_path / "latin.txt"
    latin.write_bytes("caf\xe9".encode("latin-1"))
    cases = [
        (lambda: read_text_file(str(tmp_path / "gone.txt")), f"cannot read {tmp_path / 'gone.txt'}: no such file"),
        (lambda: read_text_file(str(tmp_path)), f"cannot read {tmp_path}: it is a directory, give a text file"),
        (lambda: read_text_file(str(latin)), f"cannot read {latin}: it is not UTF-8 text (re-save it as UTF-8)"),
        (lambda: validate_gguf(tmp_path), f"cannot read {tmp_path}: it is a directory, give a .gguf file"),
        (lambda: validate_gguf(latin), f"{latin} is not a GGUF file"),
    ]
    for read, message in cases:
        with pytest.raises(AttnscopeError) as err:
            read()
        assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_a_readable_text_file_is_read_without_its_outer_newlines(tmp_path: Path) -> None:
    text = tmp_path / "t.txt"
    text.write_text("\nthe cat sat\non the mat\n\n", encoding="utf-8")
    assert read_text_file(str(text)) == "the cat sat\non the mat"
