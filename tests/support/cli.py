"""What the CLI tests share: run `attnscope` in this process, and save a model as a checkpoint for --model."""

from __future__ import annotations

import pytest

import attnscope
from attnscope.cli.main import main


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """`attnscope ARGS...` in this process: its exit code, stdout and stderr."""
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def saved(m: attnscope.Model, tmp_path_factory: pytest.TempPathFactory, name: str) -> str:
    """The model and its tokenizer saved in a fresh directory: a local checkpoint for --model."""
    path = tmp_path_factory.mktemp(name)
    m.model.save_pretrained(path)
    m.tokenizer.save_pretrained(path)
    return str(path)
