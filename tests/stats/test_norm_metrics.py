"""Norm-weighted category averages: a hand-worked example, and batched norms against the traced ones."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

import attnscope
from attnscope.capture import capturing
from attnscope.errors import AttnscopeError
from attnscope.norms import norm_attention
from attnscope.stats import engine
from attnscope.stats.engine import Settings, process_documents, values_of
from attnscope.stats.metric_sets import NORMS, resolve
from attnscope.stats.metrics import BUILTIN_METRICS, Units
from attnscope.stats.norm_metrics import NORM_METRICS, OTHER_METRIC, norm_maps, share_to
from attnscope.stats.sources import Document
from attnscope.tracing.one_pass import trace
from attnscope.verify.recompute import layer_params

TOL = 1e-5
TEXTS = ["The cat sat on the mat, again.", "Dogs bark."]


def _units(kinds: dict[str, list[bool]], valid: list[bool]) -> Units:
    as_tensor = {k: torch.tensor([v]) for k, v in kinds.items()}
    return Units(torch.tensor([valid]), torch.tensor([valid]), as_tensor, causal=False)


def test_shares_match_hand_computed_example() -> None:
    # Units: [CLS], "hi", ".", [SEP], padding. Row norms (per head) and their shares:
    #   row 0: [2, 1, 1, 0, 9] -> padding dropped -> [.5, .25, .25, 0]
    #   row 1: [1, 1, 0, 2, 0] -> [.25, .25, 0, .5]
    #   row 2: [0, 3, 1, 0, 0] -> [0, .75, .25, 0]
    #   row 3: [1, 0, 0, 1, 0] -> [.5, 0, 0, .5]
    maps = torch.tensor([[[[2.0, 1, 1, 0, 9], [1, 1, 0, 2, 0], [0, 3, 1, 0, 0], [1, 0, 0, 1, 0], [5, 5, 5, 5, 5]]]])
    units = _units({"cls": [True, False, False, False, False], "sep": [False, False, False, True, False],
                    "punct": [False, False, True, False, False], "sink": [False] * 5},
                   valid=[True, True, True, True, False])
    expected = {"cls": (0.5 + 0.25 + 0 + 0.5) / 4, "sep": (0 + 0.5 + 0 + 0.5) / 4,
                "punct": (0.25 + 0 + 0.25 + 0) / 4, "other": (0.25 + 0.25 + 0.75 + 0) / 4}
    for kind, value in expected.items():
        got, ok = share_to(kind)(maps, units)
        assert bool(ok[0]) and abs(float(got[0, 0]) - value) <= 1e-12, kind


@pytest.fixture(scope="module")
def batch_norms(minilm: attnscope.Model) -> tuple[list[torch.Tensor], torch.Tensor]:
    """norm_maps of each layer of a padded two-text batch, as a stats engine would compute them."""
    inputs = minilm.tokenizer(TEXTS, padding=True, return_tensors="pt")
    params = layer_params(minilm.model) or []
    with torch.no_grad(), capturing(minilm.model) as cap:
        minilm.model(**inputs)
    maps = [norm_maps(c.v, c.weights, p.w_o) for c, p in zip(cap.calls, params, strict=True)]
    return maps, inputs["attention_mask"]


def test_batched_norm_maps_equal_the_traced_norms(minilm: attnscope.Model,
                                                  batch_norms: tuple[list[torch.Tensor], torch.Tensor]) -> None:
    maps, mask = batch_norms
    assert int(mask[1].sum()) < mask.shape[1]  # the second text really is padded
    for row, text in enumerate(TEXTS):
        tr = trace(text, model=minilm)
        n = tr.n_tokens
        w_o = [p.w_o.numpy() for p in layer_params(minilm.model) or []]
        expected = norm_attention(tr.arrays["v"], tr.weights, w_o)["norm_head"]  # [layer, head, query, key]
        got = torch.stack([m[row, :, :n, :n] for m in maps]).numpy()
        assert np.abs(got - expected).max() <= TOL
        padded = torch.stack([m[row, :, :, n:] for m in maps])
        assert padded.numel() == 0 or padded.abs().max() == 0.0  # padded keys move nothing


def test_category_shares_add_up_to_one_on_the_bundled_model(minilm: attnscope.Model,
                                                            batch_norms: tuple[list[torch.Tensor], torch.Tensor]
                                                            ) -> None:
    maps, mask = batch_norms
    ids = minilm.tokenizer(TEXTS, padding=True)["input_ids"]
    tokens = [minilm.tokenizer.convert_ids_to_tokens(row) for row in ids]
    valid = mask.bool()
    kinds = {
        "cls": torch.tensor([[t == "[CLS]" for t in row] for row in tokens]) & valid,
        "sep": torch.tensor([[t == "[SEP]" for t in row] for row in tokens]) & valid,
        "punct": torch.tensor([[t in (".", ",") for t in row] for row in tokens]) & valid,
        "sink": torch.zeros_like(valid),
    }
    units = Units(valid, valid, kinds, causal=False)
    for layer_maps in maps:
        total = sum(share_to(kind)(layer_maps, units)[0] for kind in ("cls", "sep", "punct", "other"))
        assert torch.abs(total - 1).max() <= 1e-9


def test_the_norms_set_adds_the_norm_metrics_for_its_run_only() -> None:
    names = {m.name for m in (*NORM_METRICS, OTHER_METRIC)}
    plain, with_norms = resolve((), causal=False), resolve(("norms",), causal=False)
    assert set(with_norms.names) == set(plain.names) | (names - {"norm_sink"})
    assert set(plain.names) == {n for n, m in BUILTIN_METRICS.items() if m.applies(causal=False)}
    assert "norm_head" in with_norms.inputs and "norm_head" not in plain.inputs
    assert resolve((NORMS,), causal=False).names == with_norms.names  # by name or as itself
    assert all(m.source == "norm_head" for m in NORM_METRICS)
    causal = resolve(("norms",), causal=True).names
    assert "norm_sink" in causal and "norm_cls" not in causal and "norm_cls" in with_norms.names
    with pytest.raises(TypeError):
        BUILTIN_METRICS["norm_cls"] = NORM_METRICS[0]  # type: ignore[index]  # the built-in table is read-only


def test_unknown_or_repeated_metric_sets_are_one_line_errors() -> None:
    with pytest.raises(AttnscopeError, match=r"^metric_sets: 'nroms' is not a metric set: use one of norms"):
        resolve(("nroms",), causal=False)
    with pytest.raises(AttnscopeError, match=r"^metric_sets lists 'norms' more than once"):
        resolve(("norms", NORMS), causal=False)


def _cls_share(tr: attnscope.Trace, first_query: int = 0) -> np.ndarray:
    """Per layer and head, the mean over rows (from first_query) of the share of norm_head on key 0
    ([CLS], or a decoder's first token): [layer, head]."""
    norms = tr.norms()["norm_head"].astype(np.float64)[..., first_query:, :]  # [layer, head, query, key]
    return (norms[..., 0] / norms.sum(-1)).mean(-1)


def test_corpus_run_gives_the_norm_shares_of_each_trace(minilm: attnscope.Model) -> None:
    docs = [Document(text, f"test:{i}") for i, text in enumerate(TEXTS)]
    state = process_documents(minilm, docs, Settings(batch_size=2, metric_sets=("norms",)))  # one padded batch
    assert state.documents == 2
    expected = np.mean([_cls_share(trace(text, model=minilm)) for text in TEXTS], axis=0)
    assert np.abs(values_of(state)["norm_cls"]["mean"] - expected).max() <= TOL
    weights_cls = values_of(state)["cls"]["mean"]
    assert np.abs(weights_cls - expected).max() > 0.01  # the norms tell another story than the weights


def test_corpus_norms_of_a_grouped_query_model_equal_its_traces(
        tiny_model: Callable[[str], attnscope.Model]) -> None:
    """Llama, 4 query heads on 2 k/v heads: each query head's norms use the v of its k/v head."""
    llama = tiny_model("llama")
    docs = [Document(text, f"test:{i}") for i, text in enumerate(TEXTS)]
    state = process_documents(llama, docs, Settings(batch_size=2, metric_sets=("norms",)))
    expected = np.mean([_cls_share(trace(text, model=llama), first_query=1) for text in TEXTS], axis=0)
    got = values_of(state)["norm_sink"]["mean"]  # a causal model's first token, key 0 as [CLS] is for BERT
    assert np.isfinite(got).all() and np.abs(got - expected).max() <= TOL


def test_stats_command_adds_the_norm_columns_with_norms(tmp_path: Path, ud_dev: Path) -> None:
    import csv
    import subprocess
    import sys

    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "attnscope.cli.main", "stats", str(ud_dev), "--limit", "12", "--norms",
                           "--no-progress", "-o", str(out)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    with (out / "heads.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 72 and all(0.0 <= float(r["norm_cls_mean"]) <= 1.0 for r in rows)
    shares = [float(r[f"norm_{k}_mean"]) for r in rows[:1] for k in ("cls", "sep", "punct", "other")]
    assert abs(sum(shares) - 1.0) <= 1e-5  # the four categories split each row's norms


def test_norms_on_the_command_line_are_for_that_run_only(tmp_path: Path, ud_dev: Path) -> None:
    from attnscope.cli.main import main

    before = dict(BUILTIN_METRICS)
    assert main(["stats", str(ud_dev), "--limit", "4", "--norms", "--no-progress", "-o", str(tmp_path / "a")]) == 0
    assert main(["stats", str(ud_dev), "--limit", "4", "--no-progress", "-o", str(tmp_path / "b")]) == 0
    assert before == BUILTIN_METRICS
    assert "norm_cls_mean" in (tmp_path / "a" / "heads.csv").read_text(encoding="utf-8").splitlines()[0]
    assert "norm_cls_mean" not in (tmp_path / "b" / "heads.csv").read_text(encoding="utf-8").splitlines()[0]


def test_the_settings_a_worker_receives_say_what_it_computes(minilm: attnscope.Model) -> None:
    # As in a fresh Ray worker: the settings arrive pickled, and nothing was set up in the process beforehand.
    settings = pickle.loads(pickle.dumps(Settings(batch_size=2, metric_sets=("norms",))))
    state = engine.new_state(minilm, settings, with_syntax=False)
    docs = [Document(text, f"test:{i}") for i, text in enumerate(TEXTS)]
    done = process_documents(minilm, docs, settings, state)
    assert int(done.count["norm_cls"].min()) == 2 and int(done.count["other"].min()) == 2
    with pytest.raises(AttnscopeError, match=r"^the state holds the metrics .*norm_cls.* but the settings compute"):
        process_documents(minilm, docs, Settings(batch_size=2), state)  # settings without the norms
