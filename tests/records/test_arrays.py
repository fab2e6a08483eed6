"""A trace's arrays are cut out of the padded batch on first use: same numbers, no copies until read."""

from __future__ import annotations

import copy
import pickle
import threading
from collections.abc import Callable

import numpy as np
import pytest
import torch

import attnscope
from attnscope.capture import capturing
from attnscope.records.arrays import TraceArrays
from attnscope.stages import ARRAY_AXES
from attnscope.tracing.rows import scores

TEXTS = ["a much longer sentence that will force padding on the short one", "time flies like an arrow"]


@pytest.fixture(scope="module")
def batch(minilm: attnscope.Model) -> list[attnscope.Trace]:
    return attnscope.trace(TEXTS, model=minilm)


def test_nothing_is_copied_until_read_and_the_check_reads_nothing(minilm: attnscope.Model) -> None:
    tr = attnscope.trace(TEXTS[1], model=minilm)
    assert isinstance(tr.arrays, TraceArrays)
    assert set(tr.arrays.pending()) == set(tr.arrays) == {"x", "q", "k", "v", "scores", "weights", "context",
                                                           "output"}
    assert tr.check().ok
    assert set(tr.arrays.pending()) == set(tr.arrays)  # verifying worked on the batch, not on copies
    w = tr.arrays["weights"]
    assert "weights" not in tr.arrays.pending() and tr.arrays["weights"] is w  # laid out once, then kept


def test_each_stage_equals_the_captured_batch_row_cut_to_its_tokens(minilm: attnscope.Model,
                                                                    batch: list[attnscope.Trace]) -> None:
    enc = minilm.tokenizer(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad(), capturing(minilm.model) as cap:
        minilm.model(**enc)
    for row, tr in enumerate(batch):
        n = tr.n_tokens
        assert n == int(enc["attention_mask"][row].sum())
        for stage in ("q", "k", "v", "weights", "context"):
            captured = torch.stack([getattr(c, stage)[row] for c in cap.calls]).numpy()  # [layer, head, ...]
            want = captured[:, :, :n, :n] if stage == "weights" else captured[:, :, :n]
            np.testing.assert_array_equal(tr.arrays[stage], want, err_msg=stage)
        np.testing.assert_array_equal(tr.arrays["x"], torch.stack([x[row, :n] for x in cap.x]).numpy())
        assert tr.arrays["weights"].flags.c_contiguous and tr.arrays["weights"].shape == (6, 12, n, n)


def test_scores_are_q_k_transposed_of_the_texts_own_q_and_k(batch: list[attnscope.Trace]) -> None:
    for tr in batch:
        q, k = tr.arrays["q"].astype(np.float64), tr.arrays["k"].astype(np.float64)
        want = q @ k.swapaxes(-1, -2)  # [layer, head, query, key]
        bound = np.linalg.norm(q, axis=-1)[..., :, None] * np.linalg.norm(k, axis=-1)[..., None, :]
        assert np.max(np.abs(tr.arrays["scores"] - want) / np.maximum(1.0, bound)) <= attnscope.TOLERANCE


def test_every_array_has_the_axes_of_its_stage(batch: list[attnscope.Trace]) -> None:
    for tr in batch:
        for stage, arr in tr.arrays.items():
            assert arr.ndim == len(ARRAY_AXES[stage]), stage


def test_pickle_and_copy_lay_everything_out(minilm: attnscope.Model) -> None:
    tr = attnscope.trace(TEXTS[1], model=minilm)
    for other in (pickle.loads(pickle.dumps(tr)), copy.deepcopy(tr)):
        assert isinstance(other.arrays, TraceArrays) and other.arrays.pending() == []
        for stage in tr.arrays:
            np.testing.assert_array_equal(other.arrays[stage], tr.arrays[stage])


def test_two_threads_reading_one_stage_get_the_same_array(minilm: attnscope.Model) -> None:
    tr = attnscope.trace(TEXTS[0], model=minilm)
    got: list[np.ndarray] = []
    threads = [threading.Thread(target=lambda: got.append(tr.arrays["weights"])) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 4 and all(g is got[0] for g in got)


def test_setting_and_deleting_stages(minilm: attnscope.Model) -> None:
    tr = attnscope.trace(TEXTS[1], model=minilm)
    tr.rollout()
    assert "rollout" in tr.arrays and "rollout" not in tr.arrays.pending()
    del tr.arrays["context"]
    assert "context" not in tr.arrays and list(tr.arrays)[-1] == "rollout"
    with pytest.raises(KeyError):
        tr.arrays["merged"]


def test_nan_in_the_models_own_weights_fails_the_check(tiny_model: Callable[[str], attnscope.Model]) -> None:
    """The model returns the very weights tensor the capture saw; comparing it with itself skips the
    subtraction, but a NaN in it must still show (|NaN - NaN| is NaN)."""
    m = tiny_model("bert")
    query = m.model.encoder.layer[1].attention.self.query
    saved = query.weight.detach().clone()
    with torch.no_grad():
        query.weight[20, 3] = float("nan")  # head 1 of layer 1 (d_head 16)
    try:
        report = attnscope.trace("time flies like an arrow", model=m).check()
    finally:
        with torch.no_grad():
            query.weight.copy_(saved)
    model_weights = next(c for c in report.comparisons if (c.stage, c.source) == ("weights", "model"))
    assert np.all(model_weights.errors[0] == 0.0)
    assert np.isnan(model_weights.errors[1, 1]) and np.all(model_weights.errors[1, [0, 2, 3]] == 0.0)
    assert not report.ok


def test_a_tensor_compared_with_itself_gives_what_the_subtraction_would() -> None:
    """ErrorTable skips |a - a| for the very same tensor; the result must equal the subtraction's:
    0, NaN where a real position holds NaN or an infinity, padding ignored."""
    from attnscope.verify.check import ErrorTable

    keep = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])  # row 0 has one padded token
    w = torch.rand(2, 3, 4, 4)  # [batch, head, query, key]
    w[0, 1, 2, 0] = float("nan")
    w[1, 0, 3, 3] = float("inf")
    w[1, 2, 0, 1] = -float("inf")
    w[0, 2, 3, 3] = float("nan")  # padding (query 3 and key 3 of row 0): ignored
    x = torch.rand(2, 4, 8)
    x[1, 2, 5] = float("nan")
    table = ErrorTable(keep, n_layers=1, n_heads=3)
    for stage, t in (("weights", w), ("x", x)):
        table.add(stage, "same", 0, t, t)
        table.add(stage, "copy", 0, t, t.clone())
        np.testing.assert_array_equal(table.errors[(stage, "same")], table.errors[(stage, "copy")])
    assert np.isnan(table.errors[("weights", "same")][:, 0]).tolist() == [[False, True, False], [True, False, True]]


def test_a_dropped_trace_frees_its_batch_without_the_cycle_collector(minilm: attnscope.Model) -> None:
    """Its derived scores read the record they are in without closing over it: no reference cycle holds the
    batch (4.5 GB of weights at 2,048 SmolLM2 tokens stayed resident until gc ran: the web app's memory ceiling
    then refused the next request)."""
    import gc
    import weakref

    gc.collect()
    gc.disable()
    try:
        tr = attnscope.trace(TEXTS[1], model=minilm)
        assert "scores" in tr.arrays.pending()
        arrays, batch = weakref.ref(tr.arrays), weakref.ref(tr.arrays.layer_parts("weights")[0].base)
        del tr
        assert arrays() is None and batch() is None
        read = attnscope.trace(TEXTS[1], model=minilm)
        plain = {"q": read.arrays["q"], "k": read.arrays["k"]}
        np.testing.assert_array_equal(read.arrays["scores"], scores(plain))  # q k^T of its own q and k, as before
    finally:
        gc.enable()
