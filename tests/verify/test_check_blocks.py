"""A long causal layer's check in blocks of queries (verify.recompute.query_blocks, check._compare_block): each block
attends the keys it sees, the weights past them are held to the softmax's exact 0, and the layer's errors are the
max over the blocks. Held to the whole layer's check on the real SmolLM2 at 1,100 tokens (three blocks), and to
differences put into the captured weights where a block attends and where the mask hid the keys."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import attnscope
from attnscope import maths
from attnscope.tracing.one_pass import ForwardPass, forward_pass
from attnscope.verify import check
from attnscope.verify.check import ErrorTable, verify_batch
from attnscope.verify.recompute import QUERY_BLOCK, query_blocks

TEXT = " ".join(["The old lighthouse keeper watched the storm roll in across the bay, counting the waves as they "
                 "broke on the rocks below, and wrote each one down in a book he kept by the window."] * 30)
N = 1100  # three blocks: queries 0-511, 512-1023, 1024-1099
BOUND = 1e-6  # two recomputes of the same maths, summed in other orders: float32 rounding of sums of < 2,048 terms


@pytest.fixture(scope="module")
def captured(smollm2: attnscope.Model) -> ForwardPass:
    fp = forward_pass(TEXT, None, model=smollm2, max_length=N)
    assert int(fp.enc.inputs["input_ids"].shape[1]) == N
    return fp


def checked(fp: ForwardPass, blocks: bool, monkeypatch: pytest.MonkeyPatch) -> ErrorTable:
    with monkeypatch.context() as patch:
        if not blocks:
            patch.setattr(check, "query_blocks", lambda p, n: None)
        return verify_batch(fp.layers, fp.reference, fp.params, fp.enc.inputs["attention_mask"])


def test_the_blocks_end_on_multiples_of_the_block_size(captured: ForwardPass) -> None:
    assert captured.params is not None
    causal = captured.params[0]
    assert causal.window == maths.Window(None, 0)
    assert query_blocks(causal, N) == [(0, 512), (512, 1024), (1024, 1100)]
    assert query_blocks(causal, 2 * QUERY_BLOCK - 1) is None  # short: the layer goes whole
    for other in (maths.Window(), maths.Window(3, 0), maths.Window(2, 2)):  # encoder, sliding window, local
        assert query_blocks(dataclasses.replace(causal, window=other), N) is None


def test_in_blocks_the_check_finds_what_it_finds_whole(captured: ForwardPass,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    blocked, whole = checked(captured, True, monkeypatch), checked(captured, False, monkeypatch)
    assert blocked.errors.keys() == whole.errors.keys()
    for key, errors in whole.errors.items():
        np.testing.assert_allclose(blocked.errors[key], errors, rtol=0, atol=BOUND, err_msg=str(key))
        assert np.all(blocked.errors[key] <= check.TOLERANCE), key  # and every stage passes


@pytest.mark.parametrize(("query", "key", "where"), [(700, 650, "attended by its block"),
                                                      (700, 1050, "hidden by the mask, past the block's keys"),
                                                      (100, 101, "hidden, next to the diagonal")])
def test_a_difference_in_the_weights_is_found_in_blocks_as_whole(captured: ForwardPass, query: int, key: int,
                                                                 where: str, monkeypatch: pytest.MonkeyPatch) -> None:
    layer, head, delta = 7, 4, 1e-3
    weights = captured.layers["weights"][layer]  # [batch, head, query, key]; the model's own tensor too
    before = float(weights[0, head, query, key])
    weights[0, head, query, key] += delta
    try:
        blocked, whole = checked(captured, True, monkeypatch), checked(captured, False, monkeypatch)
    finally:
        weights[0, head, query, key] = before
    for table in (blocked, whole):
        found = table.errors[("weights", "recompute")][0, layer]  # [head]
        assert found[head] == pytest.approx(delta, abs=BOUND), where
        assert np.all(np.delete(found, head) <= BOUND), where  # only that head
        assert np.all(np.delete(table.errors[("weights", "recompute")][0], layer, axis=0) <= BOUND)


def test_nan_where_the_mask_hid_the_keys_fails_the_check(captured: ForwardPass,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    layer, head = 3, 0
    weights = captured.layers["weights"][layer]
    weights[0, head, 10, 900] = float("nan")
    try:
        blocked = checked(captured, True, monkeypatch)
    finally:
        weights[0, head, 10, 900] = 0.0
    assert np.isnan(blocked.errors[("weights", "recompute")][0, layer, head])
