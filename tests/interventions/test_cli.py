"""ablate, patch and knockout on the command line: real output, and bad input as one line with exit 2."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

import attnscope
from attnscope.interventions import ablate
from tests.support.cli import run as _run
from tests.support.cli import saved


@pytest.fixture(scope="module")
def gpt2_dir(lm_heads: Callable[[str], attnscope.Model], tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tiny random-weight GPT-2 with its LM head, saved as a checkpoint directory for --model."""
    return saved(lm_heads("gpt2"), tmp_path_factory, "gpt2")


def test_ablate_json_on_minilm(capsys: pytest.CaptureFixture[str], minilm: attnscope.Model) -> None:
    code, out, _ = _run(capsys, "ablate", "The cat sat on the mat.", "--heads", "5.11,5.3", "--format", "json")
    d = json.loads(out)
    assert code == 0 and d["heads"] == [[5, 11], [5, 3]]
    direct = ablate("The cat sat on the mat.", [(5, 11), (5, 3)], model=minilm)
    assert direct.ablated is not None
    assert d["ablated"]["embedding_distance"] == pytest.approx(direct.ablated["embedding_distance"], abs=1e-6)
    assert len(d["token_change"]) == len(d["tokens"])


def test_causal_commands(capsys: pytest.CaptureFixture[str], gpt2_dir: str, tmp_path: Path) -> None:
    code, out, _ = _run(capsys, "ablate", "the cat sat on the", "--model", gpt2_dir, "--each",
                        "--target", "mat", "--html", str(tmp_path / "g.html"))
    assert code == 0 and "d_target_logprob, each head removed alone" in out and "largest: " in out
    assert (tmp_path / "g.html").stat().st_size > 1000
    code, out, _ = _run(capsys, "patch", "the cat sat on the", "the dog ran on the", "--model", gpt2_dir,
                        "--target", "mat", "--contrast", "dog", "--format", "markdown")
    assert code == 0 and "recovered: each clean head" in out and "| layer |" in out
    code, out, _ = _run(capsys, "knockout", "the cat sat on the", "--from", "1", "--to", "4", "--model", gpt2_dir)
    assert code == 0 and "layer 1:" in out


@pytest.mark.parametrize(("argv", "message"), [
    (["ablate", "a cat", "--heads", "6.0"], "layer 6 is out of range"),
    (["ablate", "a cat", "--heads", "0.12"], "head 12 is out of range"),
    (["ablate", "a cat", "--heads", "0-1"], "--heads '0-1' is not layer.head"),
    (["ablate", "a cat"], "give --heads"),
    (["knockout", "a cat", "--from", "9", "--to", "0"], "token 9 is out of range"),
    (["knockout", "a cat", "--from", "x", "--to", "0"], "--from takes whole numbers"),
    (["patch", "the cat", "the big dog barks"], "the clean text is 4 tokens and the corrupt text 7 tokens"),
    (["ablate", "  ", "--heads", "0.0"], "is empty"),
])
def test_bad_input_is_one_line_exit_2(capsys: pytest.CaptureFixture[str], minilm: attnscope.Model,
                                     argv: list[str], message: str) -> None:
    code, out, err = _run(capsys, *argv)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and message in err and "Traceback" not in err


def test_target_that_tokenizes_to_nothing(capsys: pytest.CaptureFixture[str], gpt2_dir: str) -> None:
    code, _, err = _run(capsys, "ablate", "the cat", "--heads", "0.0", "--model", gpt2_dir, "--target", " ")
    assert code == 2 and "tokenizes to nothing" in err and err.count("\n") == 1


def test_importance_command(capsys: pytest.CaptureFixture[str], gpt2_dir: str, tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the cat sat on the mat\ndogs bark\n\na bird sings at dawn\n", encoding="utf-8")
    out = tmp_path / "out"
    argv = ["importance", str(corpus), "-o", str(out), "--model", gpt2_dir, "--sample", "2", "--batch-size", "2",
            "--no-progress"]
    code, text, _ = _run(capsys, *argv)
    assert code == 0 and "Head importance" in text and "Rank correlation" in text
    assert not any(line.startswith(("#", "|")) for line in text.splitlines())  # Markdown only with --format markdown
    assert f"Files: {out / 'importance.json'}, {out / 'heads.csv'}" in text  # full paths
    saved = json.loads((out / "importance.json").read_text())
    assert saved["documents"] == 3 and len(saved["normalised"]) == 2
    assert {p.name for p in out.iterdir()} >= {"importance.json", "heads.csv", "report.md", "importance.html"}
    code, _, err = _run(capsys, *argv)
    assert code == 2 and "not empty" in err and err.count("\n") == 1
    code, _, _ = _run(capsys, *argv, "--resume")
    assert code == 0 and json.loads((out / "importance.json").read_text())["normalised"] == saved["normalised"]


def test_effects_page_shows_in_jupyter(minilm: attnscope.Model) -> None:
    from attnscope.views.effects import effects_page

    page = effects_page(ablate("a cat", model=minilm, each=True))
    shown = page._repr_html_()
    assert shown.startswith("<div") and "<iframe sandbox=\"allow-scripts\"" in shown and "attnscope-effects" in shown
