"""Generated tokens as text: every step's token and alternatives carry the tokenizer's own decoding of their piece
(" Paris" for SmolLM2's "ĠParis"), kept through save and load; a generation saved before it loads as it was; the
`attnscope generate` tables show the decoded text repr-quoted, the marks with --raw-tokens."""

from __future__ import annotations

from pathlib import Path

import pytest

import attnscope
from attnscope.records import files
from attnscope.records.generation import GenerationTrace, load_generation
from attnscope.tracing.decoding import generate
from tests.support.cli import run

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def smol_generation(smollm2: attnscope.Model) -> GenerationTrace:
    return generate(PROMPT, model=smollm2, max_new_tokens=4, alternatives=3)


def test_steps_and_alternatives_carry_the_tokenizers_decoding(smol_generation: GenerationTrace,
                                                              smollm2: attnscope.Model) -> None:
    g, tok = smol_generation, smollm2.tokenizer
    for s in g.steps:
        assert s.decoded == tok.convert_tokens_to_string([s.text]) and s.shown == s.decoded
        assert [a.decoded for a in s.alternatives] == [tok.convert_tokens_to_string([a.text]) for a in s.alternatives]
    first = g.steps[0]
    assert first.text == "ĠParis" and first.decoded == " Paris" and first.alternatives[0].shown == " Paris"
    assert any(a.text.startswith("Ġ") for s in g.steps for a in s.alternatives)  # the marks are in the pieces
    # the sequence's tokens (the trace's and g.tokens) carry each step's decoding too
    assert [t.decoded for t in g.tokens[g.prompt_length:]] == [s.decoded for s in g.steps]
    assert [t.decoded for t in g.trace.tokens[g.prompt_length:]] == [s.decoded for s in g.steps[:-1]]
    assert [t.shown for t in g.tokens[: g.prompt_length]] == [tok.convert_tokens_to_string([t.text])
                                                              for t in g.prompt_tokens]


def test_decoding_kept_by_save_and_a_generation_saved_before_it_loads(smol_generation: GenerationTrace,
                                                                      tmp_path: Path) -> None:
    g = smol_generation
    path = tmp_path / "g.safetensors"
    g.save(path)
    loaded = load_generation(path)
    assert [s.decoded for s in loaded.steps] == [s.decoded for s in g.steps]
    assert [[a.decoded for a in s.alternatives] for s in loaded.steps] == [[a.decoded for a in s.alternatives]
                                                                          for s in g.steps]
    arrays, meta = files.read(path)
    for s in meta["generation"]["steps"]:  # as a generation saved before steps carried their decoding
        del s["decoded"]
        for a in s["alternatives"]:
            del a["decoded"]
    files.write(path, arrays, meta, {"tokens": g.trace.token_strings})
    old = load_generation(path)
    assert [s.decoded for s in old.steps] == [None] * g.n_steps
    assert [s.shown for s in old.steps] == [s.text for s in g.steps]  # its pieces, as they were shown
    assert [a.shown for a in old.steps[0].alternatives] == [a.text for a in g.steps[0].alternatives]
    assert old.check().ok == g.check().ok


def test_cli_tables_show_decoded_text_and_marks_when_asked(smollm2: attnscope.Model,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "generate", PROMPT, "--model", "smollm2", "--max-new-tokens", "2",
                         "--alternatives", "2", "--format", "markdown")
    assert code == 0, err
    row = next(line for line in out.splitlines() if line.startswith("| 0 |"))
    assert "| ' Paris' |" in row and "'Ġ" not in row  # the token, its alternatives, the attended, decoded
    assert "' capital'" in out or "' France'" in out or "' is'" in out
    code, out, err = run(capsys, "generate", PROMPT, "--model", "smollm2", "--max-new-tokens", "2",
                         "--alternatives", "2", "--format", "markdown", "--raw-tokens")
    assert code == 0, err
    row = next(line for line in out.splitlines() if line.startswith("| 0 |"))
    assert "| 'ĠParis' |" in row and "'ĠParis' 0." in row
    code, out, err = run(capsys, "generate", PROMPT, "--model", "smollm2", "--max-new-tokens", "2",
                         "--alternatives", "2")  # the terminal table, as the markdown one
    assert code == 0, err
    assert "' Paris'" in out and "ĠParis" not in out
