"""Attention rollout and flow: hand-worked examples, an independent max-flow, real models, the CLI."""

from __future__ import annotations

import json
import re
from collections import deque
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import transformers

import attnscope
from attnscope.cli.main import main
from attnscope.errors import AttnscopeError
from attnscope.rollout import flow, residual_attention, rollout
from attnscope.tracing.one_pass import Trace, trace

TOL = 1e-5
TEXT = "The cat sat on the mat."

# Two layers, two heads, two tokens. Layer 0's head mean is [[.5, .5], [.5, .5]], so
# A-hat_1 = [[.75, .25], [.25, .75]]; layer 1's head mean is [[0, 1], [0, 1]], so
# A-hat_2 = [[.5, .5], [0, 1]].
HAND = np.array([
    [[[1.0, 0.0], [0.5, 0.5]], [[0.0, 1.0], [0.5, 0.5]]],
    [[[0.0, 1.0], [0.0, 1.0]], [[0.0, 1.0], [0.0, 1.0]]],
], dtype=np.float32)  # [layer, head, query, key]


def _random_weights(layers: int, heads: int, n: int, seed: int, causal: bool = False) -> np.ndarray:
    """Softmax-like rows: positive, peaked, summing to 1 (zero on the future when causal)."""
    w = np.random.default_rng(seed).random((layers, heads, n, n)) ** 4
    if causal:
        w = w * np.tril(np.ones((n, n)))
    return w / w.sum(-1, keepdims=True)


def _edmonds_karp(cap: np.ndarray, s: int, t: int) -> float:
    """Textbook max-flow on a dense float capacity matrix: shortest augmenting paths by BFS."""
    residual = cap.astype(np.float64).copy()
    total = 0.0
    while True:
        parent = {s: s}
        queue = deque([s])
        while queue and t not in parent:
            a = queue.popleft()
            for b in np.nonzero(residual[a] > 1e-15)[0]:
                if int(b) not in parent:
                    parent[int(b)] = a
                    queue.append(int(b))
        if t not in parent:
            return total
        path = [t]
        while path[-1] != s:
            path.append(parent[path[-1]])
        edges = list(zip(path[1:], path[:-1], strict=True))  # (from, to), sink first
        push = min(residual[a, b] for a, b in edges)
        for a, b in edges:
            residual[a, b] -= push
            residual[b, a] += push
        total += push


def _reference_flow(a_hat: np.ndarray) -> np.ndarray:
    """Abnar & Zuidema's construction: nodes layer * n + position, layer i -> i-1 with capacity
    A-hat_i; max-flow from each top node to each input node, then each row divided by its sum."""
    layers, n, _ = a_hat.shape
    cap = np.zeros(((layers + 1) * n,) * 2)
    for i in range(1, layers + 1):
        cap[i * n:(i + 1) * n, (i - 1) * n:i * n] = a_hat[i - 1]
    values = np.array([[_edmonds_karp(cap, layers * n + u, v) for v in range(n)] for u in range(n)])
    return values / values.sum(-1, keepdims=True)


# --- rollout ----------------------------------------------------------------------------------

def test_rollout_matches_hand_computed_example() -> None:
    r = rollout(HAND)
    assert np.abs(r[0] - [[0.75, 0.25], [0.25, 0.75]]).max() <= TOL
    # R_2 = A-hat_2 R_1 = [[.5, .5], [.25, .75]]; the other order, R_1 A-hat_2, would give
    # [[.375, .625], [.125, .875]]
    assert np.abs(r[1] - [[0.5, 0.5], [0.25, 0.75]]).max() <= TOL


def test_rollout_renormalises_rows_that_do_not_sum_to_one() -> None:
    half = HAND[:1] * 0.5  # rows summing to 0.5, as after head masking
    expected = (0.5 * half[0].mean(0) + 0.5 * np.eye(2)) / 0.75
    assert np.abs(rollout(half)[0] - expected).max() <= TOL
    assert np.abs(rollout(half).sum(-1) - 1).max() <= TOL


def test_rollout_matches_the_published_joint_attention_on_random_weights() -> None:
    w = _random_weights(5, 3, 7, seed=1)
    aug = w.mean(1) + np.eye(7)  # the reference adds I to the head mean, then renormalises
    aug /= aug.sum(-1, keepdims=True)
    joint = [aug[0]]
    for layer in range(1, 5):
        joint.append(aug[layer].dot(joint[-1]))
    assert np.abs(rollout(w) - np.stack(joint)).max() <= 1e-12


def test_one_layer_model_rollout_is_the_residual_head_mean(minilm: attnscope.Model) -> None:
    config = transformers.BertConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=4,
                                     intermediate_size=128)
    model = attnscope.load_model(transformers.BertModel(config).eval(), tokenizer=minilm.tokenizer)
    tr = trace(TEXT, model=model)
    a_bar = tr.weights[0].mean(0)  # [query, key]
    expected = 0.5 * a_bar + 0.5 * np.eye(tr.n_tokens)
    expected /= expected.sum(-1, keepdims=True)
    assert tr.rollout().shape == (1, tr.n_tokens, tr.n_tokens)
    assert np.abs(tr.rollout()[0] - expected).max() <= TOL


@pytest.fixture(scope="module")
def minilm_trace(minilm: attnscope.Model) -> Trace:
    return trace(TEXT, model=minilm)


@pytest.fixture(scope="module")
def gpt2_trace(tiny_model: Callable[[str], attnscope.Model]) -> Trace:
    return trace(TEXT, model=tiny_model("gpt2"))


def test_rollout_rows_sum_to_one_on_the_bundled_model(minilm_trace: Trace) -> None:
    r = minilm_trace.rollout()
    assert r.shape == (6, minilm_trace.n_tokens, minilm_trace.n_tokens)
    assert np.abs(r.sum(-1) - 1).max() <= TOL
    assert r.min() >= 0


def test_rollout_of_a_causal_model_never_reaches_the_future(gpt2_trace: Trace) -> None:
    r = gpt2_trace.rollout()
    assert np.abs(r.sum(-1) - 1).max() <= TOL
    assert np.triu(r, 1).max() == 0.0  # exactly: no path leads to a later token


# --- flow -------------------------------------------------------------------------------------

def test_flow_matches_hand_computed_example() -> None:
    # Two layers: each middle position m is a path of its own, so flow = sum_m min(A-hat_2[u, m], A-hat_1[m, v]):
    # u=0: to 0, min(.5,.75) + min(.5,.25) = .75; to 1, min(.5,.25) + min(.5,.75) = .75 -> [.5, .5]
    # u=1: to 0, min(0,.75) + min(1,.25) = .25; to 1, min(0,.25) + min(1,.75) = .75 -> [.25, .75]
    assert np.abs(flow(HAND) - [[0.5, 0.5], [0.25, 0.75]]).max() <= TOL


@pytest.mark.parametrize(("layers", "n", "causal"), [(1, 4, False), (3, 5, False), (4, 6, False), (4, 6, True)])
def test_flow_matches_an_independent_max_flow(layers: int, n: int, causal: bool) -> None:
    w = _random_weights(layers, 2, n, seed=layers * 10 + n, causal=causal)
    expected = _reference_flow(residual_attention(w))
    got = flow(w)
    assert np.abs(got - expected).max() <= 1e-7  # integer capacities scaled by 2^30
    assert np.abs(got.sum(-1) - 1).max() <= TOL


def test_flow_is_not_rollout_where_a_bottleneck_limits_it() -> None:
    # Three layers, where rollout's products and flow's narrowest cut disagree.
    w = _random_weights(3, 2, 5, seed=7)
    assert np.abs(flow(w) - rollout(w)[-1]).max() > 0.01


def test_flow_on_the_bundled_model_matches_an_independent_max_flow(minilm_trace: Trace) -> None:
    f = minilm_trace.flow()
    assert f.shape == (minilm_trace.n_tokens,) * 2
    assert np.abs(f - _reference_flow(residual_attention(minilm_trace.weights))).max() <= TOL
    assert np.abs(f.sum(-1) - 1).max() <= TOL


def test_flow_of_a_causal_model_never_reaches_the_future(gpt2_trace: Trace) -> None:
    f = gpt2_trace.flow()
    assert np.triu(f, 1).max() == 0.0
    assert np.abs(f.sum(-1) - 1).max() <= TOL


def test_flow_refuses_long_texts_with_the_way_out() -> None:
    with pytest.raises(AttnscopeError, match=r"10 tokens .*at most 8 tokens.*max_tokens=10"):
        flow(_random_weights(2, 1, 10, seed=0), max_tokens=8)


def test_a_cached_flow_still_obeys_a_smaller_max_tokens(minilm_trace: Trace) -> None:
    minilm_trace.flow()  # computed and kept with the default limit
    with pytest.raises(AttnscopeError, match=f"{minilm_trace.n_tokens} tokens"):
        minilm_trace.flow(max_tokens=minilm_trace.n_tokens - 1)


# --- bad input --------------------------------------------------------------------------------

@pytest.mark.parametrize("fn", [rollout, flow])
def test_nan_weights_are_an_error_naming_where(fn: Callable[[np.ndarray], np.ndarray]) -> None:
    w = _random_weights(3, 2, 4, seed=0)
    w[1, 1, 2, 3] = np.nan
    with pytest.raises(AttnscopeError, match="layer 1, head 1, query 2, key 3"):
        fn(w)


@pytest.mark.parametrize("shape", [(2, 3, 3), (1, 1, 3, 4)])
def test_wrong_shapes_are_an_error(shape: tuple[int, ...]) -> None:
    with pytest.raises(AttnscopeError, match=r"\[layer, head, query, key\]"):
        rollout(np.full(shape, 0.25))


def test_negative_weights_are_an_error() -> None:
    with pytest.raises(AttnscopeError, match="negative"):
        rollout(-_random_weights(1, 1, 3, seed=0))


# --- saved with the trace ---------------------------------------------------------------------

@pytest.mark.parametrize("suffix", [".safetensors", ".npz"])
def test_rollout_and_flow_are_saved_with_the_trace(minilm_trace: Trace, tmp_path: Path, suffix: str) -> None:
    minilm_trace.rollout()
    minilm_trace.flow()
    minilm_trace.save(tmp_path / f"t{suffix}")
    loaded = Trace.load(tmp_path / f"t{suffix}")
    for name in ("rollout", "flow"):
        assert np.array_equal(loaded.arrays[name], minilm_trace.arrays[name])


# --- CLI --------------------------------------------------------------------------------------

def _cli_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, object]:
    assert main([*argv, "--format", "json"]) == 0
    data: dict[str, object] = json.loads(capsys.readouterr().out)
    return data


def _values(data: dict[str, object]) -> np.ndarray:
    return np.array([k["value"] for k in data["keys"]])  # type: ignore[attr-defined]


def test_cli_rollout_prints_the_cls_row_of_the_top_layer(minilm_trace: Trace,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    data = _cli_json(capsys, "rollout", TEXT)
    assert data["layer"] == 5 and data["query"] == {"index": 0, "token": "[CLS]"}
    assert [k["token"] for k in data["keys"]] == minilm_trace.token_strings  # type: ignore[attr-defined]
    assert np.abs(_values(data) - minilm_trace.rollout()[5, 0]).max() <= TOL


def test_cli_rollout_layer_and_token(minilm_trace: Trace, capsys: pytest.CaptureFixture[str]) -> None:
    data = _cli_json(capsys, "rollout", TEXT, "--layer", "2", "--token", "3")
    assert data["layer"] == 2 and data["query"] == {"index": 3, "token": minilm_trace.token_strings[3]}
    assert np.abs(_values(data) - minilm_trace.rollout()[2, 3]).max() <= TOL


def test_cli_flow_text_table(minilm_trace: Trace, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["flow", TEXT, "--token", "2"]) == 0
    out = capsys.readouterr().out
    title = " ".join(out.split("\n", 2)[:2]).split()  # the title may wrap on a narrow terminal
    assert "attention flow from the top layer (6 layers), query token 2 'cat'" in " ".join(title)
    row = minilm_trace.flow()[2]
    for i, tok in enumerate(minilm_trace.token_strings):  # every token with its value, 4 decimals
        assert re.search(rf"\n +{i} │ {re.escape(tok)} +│ {row[i]:.4f} │", out)


def test_cli_default_query_of_a_causal_model_is_the_last_token(
    tiny_model: Callable[[str], attnscope.Model], gpt2_trace: Trace, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    m = tiny_model("gpt2")
    m.model.save_pretrained(tmp_path)
    m.tokenizer.save_pretrained(tmp_path)
    data = _cli_json(capsys, "flow", TEXT, "--model", str(tmp_path))
    last = gpt2_trace.n_tokens - 1
    assert data["query"] == {"index": last, "token": "[SEP]"}
    assert np.abs(_values(data) - gpt2_trace.flow()[last]).max() <= TOL


@pytest.mark.parametrize(("argv", "message"), [
    (["rollout", TEXT, "--layer", "6"], "layer 6 is out of range: this model has 6 layers, valid values are 0..5"),
    (["rollout", TEXT, "--token", "99"], "token 99 is out of range"),
    (["flow", TEXT, "--max-tokens", "4"], "at most 4 tokens, or accept the cost with --max-tokens 9"),
])
def test_cli_errors_are_one_line_and_exit_2(argv: list[str], message: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnscope: error: ") and message in err and err.count("\n") == 1


def test_cli_rollout_explains_a_causal_models_pile_up_on_token_0(smollm2: attnscope.Model,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """SmolLM2's rollout over its 30 layers puts ~100% on token 0, which looks broken without a word: position 0
    reads only itself, so every path that reaches it ends there. The note comes where token 0 holds >= 90%."""
    text = "The cat sat on the mat"
    top = _cli_json(capsys, "rollout", text, "--model", "smollm2")
    assert _values(top)[0] >= 0.99 and top["note"] == (  # type: ignore[index]
        "in a causal model position 0 reads only itself at every layer, so every path that reaches it ends on "
        f"token 0: over 30 layers rollout gathers {_values(top)[0]:.0%} there. A lower --layer shows the mixing "
        "before that.")
    low = _cli_json(capsys, "rollout", text, "--model", "smollm2", "--layer", "1")
    assert _values(low)[0] < 0.9 and "note" not in low
    assert main(["rollout", text, "--model", "smollm2", "--format", "markdown"]) == 0
    assert capsys.readouterr().out.endswith("\nnote: in a causal model position 0 reads only itself at every layer, "
                                            "so every path that reaches it ends on token 0: over 30 layers rollout "
                                            "gathers 100% there. A lower --layer shows the mixing before that.\n")
    assert "note" not in _cli_json(capsys, "rollout", TEXT)  # MiniLM reads both ways: no pile-up to explain
