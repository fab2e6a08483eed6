"""Corpus statistics on the real SmolLM2 (a causal Llama-architecture model with grouped-query attention):
the engine's attention-sink share equals the same number computed from attnscope.trace of each sentence;
`attnscope stats --device/--dtype`."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

import attnscope
from attnscope.cli.main import main
from attnscope.stats import Document, Settings, Source, StatsState, process_documents

TOL = 1e-5  # float32 maps of the same model on the same tokens; the statistics are in float64
N_SENTENCES = 4


def sink_share(tr: attnscope.Trace) -> np.ndarray:
    """[layer, head]: the mean over query rows 1.. of the weight on token 0 (row 0 can only attend to itself;
    SmolLM2's tokenizer adds no BOS, so token 0 is the sentence's first piece)."""
    to_first = tr.weights.astype(np.float64)[:, :, 1:, 0]  # [layer, head, query >= 1]
    return np.asarray(to_first.mean(-1))


@pytest.fixture(scope="module")
def docs(ud_dev: Path) -> list[Document]:
    return list(itertools.islice(Source(str(ud_dev)), N_SENTENCES))


@pytest.fixture(scope="module")
def state(smollm2: attnscope.Model, docs: list[Document]) -> StatsState:
    return process_documents(smollm2, docs, Settings(batch_size=N_SENTENCES))  # one padded batch


def test_stats_sink_equals_trace_on_smollm2(smollm2: attnscope.Model, docs: list[Document], state: StatsState) -> None:
    assert state.settings["causal"] is True
    assert "sink" in state.metrics and "cls" not in state.metrics and "sep" not in state.metrics
    traces = [attnscope.trace(d.text, model=smollm2) for d in docs]
    assert state.documents == N_SENTENCES and state.tokens == sum(t.n_tokens for t in traces)
    # a one-token sentence ("***", the 4th) has no row that counts: the engine leaves it out of the mean
    counted = [t for t in traces if t.n_tokens > 1]
    assert len(counted) == N_SENTENCES - 1
    expected = np.mean([sink_share(t) for t in counted], axis=0)  # [layer, head]: the mean over documents
    got = state.mean("sink")
    assert got.shape == (smollm2.n_layers, smollm2.n_heads) == (30, 9)
    assert np.abs(got - expected).max() <= TOL
    assert abs(got[3, 5] - expected[3, 5]) <= TOL  # the head the notebook and explain show
    assert (state.count["sink"] == len(counted)).all()


def test_cli_stats_on_smollm2_with_device_and_dtype(smollm2: attnscope.Model, ud_dev: Path, state: StatsState,
                                                    tmp_path: Path) -> None:
    out = tmp_path / "run"  # the smollm2 fixture's model is reused: load_model caches per (name, device, dtype)
    assert main(["stats", str(ud_dev), "--model", "smollm2", "--device", "cpu", "--dtype", "float32",
                 "--limit", str(N_SENTENCES), "-o", str(out), "--no-progress", "--format", "json"]) == 0
    table = pq.read_table(out / "heads.parquet").to_pandas()
    sink = table.pivot(index="layer", columns="head", values="sink_mean").to_numpy()  # [layer, head]
    assert np.abs(sink - state.mean("sink")).max() <= TOL
    assert "cls_mean" not in table.columns  # causal: no [CLS]/[SEP] metrics


def test_bfloat16_statistics_equal_the_bfloat16_trace(tiny_model: Callable[[str], attnscope.Model]) -> None:
    llama = attnscope.load_model(tiny_model("llama"), dtype="bfloat16")
    text = "The quick brown fox, unsurprisingly, jumps over the lazy dog."
    state = process_documents(llama, [Document(text, "t")], Settings())
    tr = attnscope.trace(text, model=llama, recompute=False)
    assert tr.weights.dtype == np.float32  # bfloat16 maps widened exactly: the statistics read the same numbers
    assert np.abs(state.mean("sink") - sink_share(tr)).max() <= 1e-6


def test_device_and_dtype_are_refused_on_ray(ud_dev: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["stats", str(ud_dev), "--engine", "ray", "--dtype", "bfloat16", "-o", str(tmp_path / "o"),
                 "--no-progress"]) == 2
    assert capsys.readouterr().err == ("attnscope: error: --device and --dtype place the model of a local run: "
                                       "drop them with --engine ray\n")
