"""The Attribution record (torch-free): verdicts, exit codes, strict JSON, and the renderings."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import numpy as np

from attnscope.attribution import render
from attnscope.attribution.record import Attribution, Cost, MethodCheck, MethodScores, spearman
from attnscope.tokens import Token


def _scores(name: str, verified: bool | None, value: float = 0.0) -> MethodScores:
    check = MethodCheck(name="c", value=value, bound=1e-5, verified=verified, detail="why")
    return MethodScores(method=name, scores=np.array([[0.5, float("nan")]]), unit="u", check=check,
                        cost=Cost(forwards=3, backwards=1, seconds=0.5))


def _record(*methods: MethodScores) -> Attribution:
    tokens = [Token(index=0, text="a|b", id=1), Token(index=1, text="c", id=2)]
    return Attribution(model="m", architecture="A", kind="causal", description="log p(' x' | 'a')", tokens=tokens,
                       targets=[" x"], methods={m.method: m for m in methods})


def test_verdicts_and_exit_codes() -> None:
    assert _record(_scores("a", True)).exit_code == 0
    assert _record(_scores("a", True), _scores("b", None)).status == "NOT VERIFIED"
    assert _record(_scores("a", None), _scores("b", False, 1.0)).exit_code == 1  # a failure outranks
    assert _record(_scores("a", True), _scores("b", None)).exit_code == 3


def test_strict_json_and_markdown() -> None:
    a = _record(_scores("a", True))
    data = json.loads(json.dumps(a.to_json(), allow_nan=False))
    assert data["methods"]["a"]["scores"] == [[0.5, None]]  # NaN stays visible as null, never 0
    md = render.markdown(a)
    assert "`0:a\\|b`" in md and "| a | 0.5 | nan |" in md  # a | in a token does not break the table


def test_record_and_render_are_torch_free() -> None:
    probe = ("import sys, attnscope.attribution.record, attnscope.attribution.render\n"
             "print('torch' in sys.modules or 'transformers' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "False", done.stderr


def test_rank_agreement_is_spearman() -> None:
    from scipy.stats import spearmanr

    rng = np.random.default_rng(0)
    rows = rng.normal(size=(4, 9))
    rows[3, :3] = rows[3, 3]  # ties share their mean rank
    rho = spearman(rows)
    expected = spearmanr(rows, axis=1).statistic
    assert np.allclose(rho, expected, atol=1e-12)
    assert np.isnan(spearman(np.array([[1.0, 2.0], [3.0, 3.0]]))[1]).all()  # a constant row ranks nothing
    a = _record(_scores("a", True), _scores("b", True))
    assert np.isnan(a.rank_agreement()).all()  # rows holding NaN: no ranking, never a made-up number


def _pieces() -> Attribution:
    tokens = [Token(index=0, text="[bold]", id=1, decoded="[bold]"), Token(index=1, text="Ġcapital", id=2,
                                                                          decoded=" capital"),
              Token(index=2, text="Ċ", id=3, decoded="\n")]
    ms = MethodScores(method="[red]m", scores=np.array([[0.5, 0.25, 0.125]]), unit="u",
                      check=MethodCheck(name="c", value=0.0, bound=1e-5, verified=True, detail="[i]why"),
                      cost=Cost(forwards=1, backwards=0, seconds=0.1))
    return Attribution(model="m", architecture="A", kind="causal", description="log p('[b]x' | 'a')", tokens=tokens,
                       targets=["[b]x"], methods={"[red]m": ms})


def _printed(a: Attribution, raw_tokens: bool = False) -> str:
    from rich.console import Console

    out = Console(width=200, record=True, file=io.StringIO())
    for r in render.text_renderables(a, raw_tokens=raw_tokens):
        out.print(r)
    return out.export_text()


def test_the_text_table_shows_decoded_tokens_and_markup_literally() -> None:
    text = _printed(_pieces())
    assert "0:[bold]" in text and "1: capital" in text and "2:\\n" in text and "Ġ" not in text
    assert "[red]m" in text and "[b]x" in text and "[i]why" in text  # names, targets, details: all literal
    assert "1:Ġcapital" in _printed(_pieces(), raw_tokens=True)
    md = render.markdown(_pieces())
    assert "`1: capital`" in md and "`1:Ġcapital`" in render.markdown(_pieces(), raw_tokens=True)


def test_unescaped_markup_would_be_eaten() -> None:
    """The test above can fail: rich reads an unescaped "[bold]" as markup and prints nothing of it."""
    from rich.console import Console

    out = Console(width=80, record=True, file=io.StringIO())
    out.print("0:[bold]")
    assert "[bold]" not in out.export_text()
