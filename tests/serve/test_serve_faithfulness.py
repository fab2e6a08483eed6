"""POST /api/faithfulness (serve/faithfulness.py) on a real `attnscope serve` (the bundled MiniLM): the answer's rows
are the library's (faithfulness.run.example_rows) for the same text, the curves' x axes are k / m, the cost
admitted counts the modified inputs the library scores, and bad input or a text too costly for the deadline is a
one-line 422 saying how big a text may be (never a 500)."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from typing import Any

import pytest

import attnscope
from attnscope.attribution.objective import build_objective
from attnscope.errors import AttnscopeError
from attnscope.faithfulness import metrics as fm
from attnscope.faithfulness.perturb import Perturber
from attnscope.faithfulness.run import Settings, example_rows
from attnscope.serve.faithfulness import Cost, admit, perturbed_rows, rows_for
from attnscope.stats.sources import Document
from tests.support.serve import MAX_TOKENS, Server, start_server

TEXT = "The cat sat on the mat."
LONG = ("In the eastern city of Baqubah, guerrillas detonated a car bomb outside a police station, killing several "
        "people and wounding more.")
TOLERANCE = 1e-5  # float32 forwards in two processes, each on one torch thread: the same batches, the same sums


def library_rows(m: attnscope.Model, text: str, **settings: Any) -> list[dict[str, Any]]:
    """What `attnscope faithfulness` computes for this text as its example 0."""
    return example_rows(m, Document(text, "request"), 0, Settings(max_length=MAX_TOKENS, **settings))


def assert_rows_equal(got: list[dict[str, Any]], want: list[dict[str, Any]]) -> None:
    """Every field of every row: strings, flags and counts exactly; numbers (and curves) within TOLERANCE; NaN is
    null in JSON."""
    assert [r["method"] for r in got] == [r["method"] for r in want]
    for g, w in zip(got, want, strict=True):
        assert set(g) == set(w), g["method"]
        for key, value in w.items():
            if isinstance(value, bool | str | int) or value is None:
                assert g[key] == value, (w["method"], key)
            elif isinstance(value, float):
                assert (g[key] is None) == math.isnan(value), (w["method"], key)
                assert g[key] is None or abs(g[key] - value) <= TOLERANCE, (w["method"], key, g[key], value)
            else:
                assert len(g[key]) == len(value), (w["method"], key)
                assert max(abs(a - b) for a, b in zip(g[key], value, strict=True)) <= TOLERANCE, (w["method"], key)


@pytest.mark.parametrize(("methods", "removal", "seeds"), [("attention,rollout,alti", "delete", 3),
                                                           ("leave_one_out_replaced,norm", "replace", 2)])
def test_the_answer_is_the_librarys_rows(server: Server, minilm: attnscope.Model, one_torch_thread: None,
                                         methods: str, removal: str, seeds: int) -> None:
    with server.client(timeout=120) as http:
        r = http.post("/api/faithfulness", json={"text": TEXT, "methods": methods, "removal": removal,
                                                 "seeds": seeds})
    assert r.status_code == 200, r.text
    body = r.json()
    want = library_rows(minilm, TEXT, methods=tuple(methods.split(",")), removal=removal, seeds=seeds)
    assert_rows_equal(body["rows"], want)
    controls = [f"random_{s}" for s in range(seeds)] + ["position"]
    assert [r["method"] for r in body["rows"]][-len(controls):] == controls
    assert body["removal"] == removal and body["special_tokens_removed"] is False and body["kind"] == "encoder"
    assert [t["removable"] for t in body["tokens"]] == [not t["special"] for t in body["tokens"]]


def test_the_curves_x_axes_are_the_share_of_removable_tokens(server: Server) -> None:
    with server.client(timeout=120) as http:
        body = http.post("/api/faithfulness", json={"text": TEXT, "methods": "attention"}).json()
    row = body["rows"][0]
    m, kept = row["removable"], row["min_kept"]
    assert body["deletion_x"] == [k / m for k in range(m - kept + 1)]
    assert body["insertion_x"] == [k / m for k in range(kept, m + 1)]
    assert all(len(r["deletion"]) == len(body["deletion_x"]) and len(r["insertion"]) == len(body["insertion_x"])
               for r in body["rows"])
    assert row["deletion"][0] == pytest.approx(row["full"], abs=TOLERANCE)  # nothing removed yet: f(x)


@pytest.mark.parametrize(("text", "exact"), [(TEXT, True), (LONG, False)])
def test_the_admitted_cost_counts_the_modified_inputs_the_library_scores(minilm: attnscope.Model, text: str,
                                                                         exact: bool) -> None:
    """perturbed_rows is at least the library's count (Perturber.forwards) and within 10% of it: exact when the
    bounds are exact (every subset), the beam search's shared children counted once each at most."""
    obj = build_objective(minilm, text, max_length=64)
    ex = Perturber(obj, "delete").example()
    assert (ex.m <= fm.EXACT_TOKENS) == exact
    rows = library_rows(minilm, text, methods=("attention", "rollout"))
    orderings = len(rows)  # attention, rollout, leave_one_out, 3 random, position
    estimate = perturbed_rows(orderings, ex, fm.EXACT_TOKENS, fm.BEAM)
    used = rows[0]["forwards"]
    assert used <= estimate <= 1.1 * used
    if exact:
        assert estimate == used


def test_a_job_over_the_deadline_is_refused_saying_how_many_tokens_fit() -> None:
    cost = Cost(tokens=40, attribution={"leave_one_out": 41.0, "alti": 1.0}, perturbed=2000, row_seconds=0.02,
                perturbed_seconds=0.005, orderings=7, removable=38, min_kept=0)
    assert cost.seconds() == pytest.approx(42 * 0.02 + 2000 * 0.005)
    ten = rows_for(7, 8, 0, fm.EXACT_TOKENS, fm.BEAM)  # 10 tokens: 8 removable, every subset of them
    assert ten == 7 * 2 * 9 + 2 ** 8 + 1
    assert cost.seconds(10) == pytest.approx(42 * 0.02 * (10 / 40) ** 2 + ten * 0.005 * 10 / 40)
    admit(cost, time.monotonic() + 60)  # 10.8 s of 60: admitted
    with pytest.raises(AttnscopeError) as err:
        admit(cost, time.monotonic() + 3)
    message = str(err.value)
    fits = int(message.split("about ")[-1].split(" tokens")[0])
    assert cost.seconds(fits) <= 3 < cost.seconds(fits + 1)
    assert "2000 modified inputs" in message and "leave_one_out ~41" in message and "--timeout" in message


@pytest.mark.parametrize(("body", "message"), [
    ({"text": TEXT, "methods": "nope"}, "unknown attribution method 'nope'"),
    ({"text": TEXT, "methods": "saliency"}, "saliency does not apply to all-MiniLM-L6-v2"),
    ({"text": TEXT, "removal": "erase"}, "field 'removal' must be one of 'delete', 'replace'"),
    ({"text": TEXT, "seeds": 0}, "field 'seeds' must be from 1 to 10"),
    ({"text": TEXT, "seeds": 11}, "field 'seeds' must be from 1 to 10"),
    ({"text": " ".join(["word"] * 40)}, f"over this server's limit of {MAX_TOKENS}"),
    ({"text": TEXT, "max_length": 4}, "tokens long, over the maximum of 4"),
    ({"text": TEXT, "target": " Paris"}, "unknown field 'target'"),
])
def test_refusals_are_one_line_422s(server: Server, body: dict[str, Any], message: str) -> None:
    with server.client(timeout=120) as http:
        r = http.post("/api/faithfulness", json=body)
    assert r.status_code == 422, r.text
    assert message in r.json()["error"] and "\n" not in r.json()["error"]


@pytest.fixture(scope="module")
def tight() -> Iterator[Server]:
    """A server whose deadline (4 s) cannot hold a long text's faithfulness under every default method."""
    s = start_server("--max-tokens", "64", "--timeout", "4")
    yield s
    assert s.stop() == 0, "".join(s.stderr)[-2000:]
    assert "Traceback" not in "".join(s.stderr), "".join(s.stderr)[-4000:]


def test_a_text_too_costly_for_the_deadline_is_a_422_naming_what_fits(tight: Server) -> None:
    started = time.monotonic()
    with tight.client(timeout=60) as http:
        r = http.post("/api/faithfulness", json={"text": LONG})
        after = http.post("/api/faithfulness", json={"text": "The cat sat.", "methods": "attention"})
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert "modified inputs" in error and "tokens (special tokens included) would fit" in error, error
    assert time.monotonic() - started < 30  # refused up front, not after running to the deadline
    assert after.status_code == 200, after.text  # the model is free again
