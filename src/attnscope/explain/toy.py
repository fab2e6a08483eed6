"""The classic 3-input example that tutorials compute by hand, numbered as their 7 steps.

The classic derivation ("Illustrated: Self-Attention"): 1 prepare inputs, 2 initialise weights,
3 derive keys, queries and values, 4 attention scores, 5 softmax, 6 multiply each value by its
weight, 7 sum the weighted values. The scaling (4b) and the causal mask (4c) come between 4 and 5.

numpy only (float64, so hand arithmetic matches): `attnscope toy` imports neither torch nor
transformers. tests/explain/test_toy.py checks every number against the taught torch maths (maths.py).
"""

from __future__ import annotations

import math

import numpy as np

from attnscope.explain.steps import Step, Walkthrough
from attnscope.numbers import SCALING_RULE, value

X = [[1, 0, 1, 0], [0, 2, 0, 2], [1, 1, 1, 1]]  # [token, d_model] = [3, 4]
W_K = [[0, 0, 1], [1, 1, 0], [0, 1, 0], [1, 1, 0]]  # [d_model, d_head] = [4, 3]
W_Q = [[1, 0, 1], [1, 0, 0], [0, 0, 1], [0, 1, 1]]
W_V = [[0, 2, 0], [0, 3, 0], [1, 0, 3], [1, 1, 0]]
# The hand-worked tutorial rounds input 1's unscaled softmax [0.0634, 0.4683, 0.4683] to these.
TUTORIAL_WEIGHTS_1 = [0.0, 0.5, 0.5]
INPUTS = ["input 1", "input 2", "input 3"]  # the tutorials count inputs from 1


def toy_stages(scale: bool = True, causal: bool = False) -> dict[str, np.ndarray]:
    """Every stage of single-head attention on the toy inputs, float64.

    scale=False skips the scaling, as many hand-worked tutorials do; causal=True adds -inf above
    the diagonal before the softmax, so input i sees inputs 1..i only.
    """
    x = np.asarray(X, dtype=np.float64)
    q = x @ np.asarray(W_Q, dtype=np.float64)  # [token, d_head]
    k = x @ np.asarray(W_K, dtype=np.float64)
    v = x @ np.asarray(W_V, dtype=np.float64)
    scores = q @ k.T  # [query, key]
    scaled = scores / math.sqrt(q.shape[-1]) if scale else scores
    n = len(X)
    mask = np.where(np.triu(np.ones((n, n), dtype=bool), 1), -np.inf, 0.0) if causal else np.zeros((n, n))
    masked = scaled + mask
    e = np.exp(masked - masked.max(axis=-1, keepdims=True))  # the diagonal is never masked: max is finite
    weights = e / e.sum(axis=-1, keepdims=True)
    weighted = weights[:, :, None] * v[None, :, :]  # [query, key, d_head]: weight_qk times value row k
    context = weighted.sum(axis=1)  # [query, d_head]
    return {"x": x, "W_Q": np.asarray(W_Q), "W_K": np.asarray(W_K), "W_V": np.asarray(W_V), "q": q, "k": k,
            "v": v, "scores": scores, "scaled": scaled, "mask": mask, "masked": masked, "weights": weights,
            "weighted": weighted, "context": context}


def _vec(a: np.ndarray) -> str:
    return "[" + ", ".join(value(float(x)) for x in a) + "]"


def _exact(a: np.ndarray) -> str:
    """Hand-worked numbers as the tutorial writes them: [2.0, 7.0, 1.5]."""
    return "[" + ", ".join(f"{float(x):.1f}" for x in a) + "]"


def rounding_note(st: dict[str, np.ndarray], scale: bool, causal: bool) -> str:
    """Why output 1 differs from the hand-worked tutorial's [2.0, 7.0, 1.5]."""
    ours = f"Output 1 here is {_vec(st['context'][0])}."
    if scale or causal:
        return (ours + " The hand-worked tutorial skips the scaling and the mask: run `attnscope toy "
                "--no-scale` to compare with it.")
    hand = np.asarray(TUTORIAL_WEIGHTS_1) @ st["v"]
    return (f"{ours} The hand-worked tutorial gets {_exact(hand)} because it rounds input 1's softmax "
            f"{_vec(st['weights'][0])} to {TUTORIAL_WEIGHTS_1}: 0.5 x {_exact(st['v'][1])} + 0.5 x "
            f"{_exact(st['v'][2])}. Nothing is rounded here.")


def _mask_step(st: dict[str, np.ndarray], scale: bool) -> Step:
    plain = toy_stages(scale, causal=False)["weights"]
    changed = [INPUTS[i] for i in range(len(X)) if not np.array_equal(plain[i], st["weights"][i])]
    text = ("Causal (decoder) attention: -inf is added to every key after the query, so input i sees "
            "inputs 1..i only; exp(-inf) = 0 in the softmax. The mask changes the rows of "
            f"{', '.join(changed)}; the last input sees every input and keeps its row.")
    return Step("masked", "Causal mask: add -inf above the diagonal", text, "[query, key] = [3, 3]",
                {"mask": st["mask"], "masked": st["masked"]}, INPUTS, INPUTS, number="4c")


def _weighted_steps(st: dict[str, np.ndarray], note: str) -> list[Step]:
    keys = [f"weight x v{j + 1}" for j in range(len(X))]
    arrays = {f"{INPUTS[i]}: weight_{i + 1}j x v_j": st["weighted"][i] for i in range(len(X))}
    six = Step("weighted", "Multiply each value by its weight",
               "For every query i, row j is weight[i, j] times value row v_j.",
               "[query, key, d_head] = [3, 3, 3]", arrays, keys, number="6")
    seven = Step("context", "Sum the weighted values: the outputs",
                 "Output i is the sum of query i's weighted values (the rows of step 6). " + note,
                 "[query, d_head] = [3, 3]", {"context": st["context"]}, INPUTS, number="7")
    return [six, seven]


def toy_walkthrough(scale: bool = True, causal: bool = False) -> Walkthrough:
    """The toy example as explain-style steps, numbered as the classic 7 (4b, 4c: scaling, mask)."""
    st = toy_stages(scale, causal)
    how = (f"{SCALING_RULE}: ÷ sqrt(3) = ÷ {value(math.sqrt(3))} = × {value(3 ** -0.5)}" if scale
           else "skipped (--no-scale), as hand-worked tutorials do")
    ins = INPUTS
    steps = [
        Step("x", "Prepare inputs", "Three inputs of width 4.", "[token, d_model] = [3, 4]", {"x": st["x"]}, ins,
             number="1"),
        Step("projections", "Initialise weights", "Key, query and value weights, each [d_model, d_k] = [4, 3].",
             "[4, 3]", {"W_K": st["W_K"], "W_Q": st["W_Q"], "W_V": st["W_V"]}, number="2"),
        Step("k", "Derive keys K = x W_K", "", "[3, 3]", {"k": st["k"]}, ins, number="3a"),
        Step("q", "Derive queries Q = x W_Q", "", "[3, 3]", {"q": st["q"]}, ins, number="3b"),
        Step("v", "Derive values V = x W_V", "", "[3, 3]", {"v": st["v"]}, ins, number="3c"),
        Step("scores", "Attention scores = Q K^T", "Row i holds query i's dot product with every key.", "[3, 3]",
             {"scores": st["scores"]}, ins, ins, number="4"),
        Step("scaled", "Scale (between classic steps 4 and 5)", f"Then {how}.", "[3, 3]",
             {"scaled": st["scaled"]}, ins, ins, number="4b"),
    ]
    steps += [_mask_step(st, scale)] if causal else []
    steps.append(Step("weights", "Softmax", "Each row becomes a probability distribution (row sums shown).",
                      "[3, 3]", {"weights": st["weights"], "row sums": st["weights"].sum(-1, keepdims=True)},
                      ins, ins, number="5"))
    steps += _weighted_steps(st, rounding_note(st, scale, causal))
    model = {"name": "toy example", "layers": 1, "heads": 1, "d_head": 3, "scaled": scale, "causal": causal}
    return Walkthrough(model, 0, 0, None, [], steps, {})
