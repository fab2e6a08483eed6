"""The stats package's shape: library errors name Python parameters and the CLI names its flags; the Ray
engine reaches into no private name of the local one."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import attnscope
from attnscope.cli.main import error_line, main
from attnscope.cli.stats import as_flags
from attnscope.errors import AttnscopeError
from attnscope.stats import Document, Settings, process_documents

DISTRIBUTED = Path(attnscope.__file__).parent / "stats" / "distributed"
DOCS = [Document("word " * 40, "long"), Document("Short one.", "short")]


@pytest.mark.parametrize(("settings", "message"), [
    (Settings(max_length=2), "max_length 2 is too small: a text needs 2 special tokens"),
    (Settings(max_length=100_000), "max_length 100000 exceeds what"),
    (Settings(batch_size=0), "batch_size=0 must be at least 1"),
    (Settings(limit=0), "limit=0 must be at least 1"),
    (Settings(chunk_batches=0), "chunk_batches=0 must be at least 1"),
    (Settings(max_length=16, truncate=False), "long: the document is over 16 tokens: raise max_length, or set "
                                              "truncate=True to truncate it"),
    (Settings(metric_sets=("nroms",)), "metric_sets: 'nroms' is not a metric set"),
])
def test_library_errors_name_python_parameters(minilm: attnscope.Model, settings: Settings, message: str) -> None:
    with pytest.raises(AttnscopeError) as err:
        process_documents(minilm, DOCS, settings)
    assert str(err.value).startswith(message) and "--" not in str(err.value)
    assert err.value.parameter is not None and err.value.parameter in message


@pytest.mark.parametrize(("library", "parameter", "cli"), [
    ("batch_size=0 must be at least 1", "batch_size", "--batch-size 0 must be at least 1"),
    ("long: the document is over 16 tokens: raise max_length, or set truncate=True to truncate it", "max_length",
     "long: the document is over 16 tokens: raise --max-length, or drop --no-truncate to truncate it"),
    ("out already exists and is not empty: pass resume=True to continue that run, or choose another outdir", None,
     "out already exists and is not empty: pass --resume to continue that run, or choose another -o OUTDIR"),
    ("f.csv has several columns (a, b): choose one with column=NAME", "column",
     "f.csv has several columns (a, b): choose one with --column NAME"),
    ("workers=0 must be at least 1", "workers", "--workers 0 must be at least 1"),
    ("ckpt is from a run with other arguments (settings.max_length 256 -> 128)", None,
     "ckpt is from a run with other arguments (settings.max_length 256 -> 128)"),  # the checkpoint's own keys
])
def test_the_cli_names_its_flags(library: str, parameter: str | None, cli: str) -> None:
    assert error_line(AttnscopeError(as_flags(library), parameter=parameter)) == cli


def test_the_command_reports_a_bad_option_by_its_flag(ud_dev: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["stats", str(ud_dev), "--batch-size", "0", "--no-progress", "-o", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err == "attnscope: error: --batch-size 0 must be at least 1\n"


def _private_reaches(path: Path) -> list[str]:
    """`module._name` uses and `from attnscope... import _name` imports of attnscope's modules in one file."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    modules: set[str] = set()
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("attnscope"):
            for alias in node.names:
                if alias.name.startswith("_"):
                    found.append(f"from {node.module} import {alias.name}")
                modules.add(alias.asname or alias.name)  # a module or not: an attribute of either counts
        elif isinstance(node, ast.Import):
            modules.update((a.asname or a.name).split(".")[0] for a in node.names if a.name.startswith("attnscope"))
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules
                and node.attr.startswith("_") and not node.attr.startswith("__")):
            found.append(f"{node.value.id}.{node.attr}")
    return found


def test_the_ray_engine_uses_public_functions_only() -> None:
    files = sorted(DISTRIBUTED.glob("*.py"))
    assert len(files) >= 4
    assert {str(f.name): _private_reaches(f) for f in files} == {str(f.name): [] for f in files}


def test_the_private_reach_finder_finds_one(tmp_path: Path) -> None:
    example = tmp_path / "example.py"  # what the Ray engine did before
    example.write_text("from attnscope.stats import engine as local\nlocal._batches(1)\n", encoding="utf-8")
    assert _private_reaches(example) == ["local._batches"]
