"""The classic 3-token example that tutorials compute by hand, every step exposed."""

from __future__ import annotations

import torch

from attnscope import maths
from attnscope.explain import Step, Walkthrough

X = [[1, 0, 1, 0], [0, 2, 0, 2], [1, 1, 1, 1]]  # [token, d_model] = [3, 4]
W_K = [[0, 0, 1], [1, 1, 0], [0, 1, 0], [1, 1, 0]]  # [d_model, d_head] = [4, 3]
W_Q = [[1, 0, 1], [1, 0, 0], [0, 0, 1], [0, 1, 1]]
W_V = [[0, 2, 0], [0, 3, 0], [1, 0, 3], [1, 1, 0]]


def toy_stages(scale: bool = True) -> dict[str, torch.Tensor]:
    """Every stage of single-head attention on the toy inputs (float64, so hand arithmetic matches).

    scale=False skips the / sqrt(d_k) step, as many hand-worked tutorials do.
    """
    x = torch.tensor(X, dtype=torch.float64)
    q = x @ torch.tensor(W_Q, dtype=torch.float64)  # [token, d_head]
    k = x @ torch.tensor(W_K, dtype=torch.float64)
    v = x @ torch.tensor(W_V, dtype=torch.float64)
    scores = maths.dot_scores(q, k)  # [query, key]
    scaled = maths.scale(scores, q.shape[-1] ** -0.5 if scale else 1.0)
    weights = maths.softmax(scaled)
    context = maths.attend(weights, v)  # [query, d_head]
    return {"x": x, "W_Q": torch.tensor(W_Q), "W_K": torch.tensor(W_K), "W_V": torch.tensor(W_V),
            "q": q, "k": k, "v": v, "scores": scores, "scaled": scaled, "weights": weights,
            "context": context}


def toy_walkthrough(scale: bool = True) -> Walkthrough:
    """The toy example as explain-style steps."""
    st = {k: v.numpy() for k, v in toy_stages(scale).items()}
    inputs = ["input 1", "input 2", "input 3"]
    how = "divide by sqrt(d_k) = sqrt(3) = 1.7321" if scale else "skipped (--no-scale), as hand-worked tutorials do"
    steps = [
        Step("x", "Inputs x", "Three inputs of width 4.", "[token, d_model] = [3, 4]", {"x": st["x"]}, inputs),
        Step("projections", "Weights", "Key, query and value weights, each [d_model, d_k] = [4, 3].",
             "[4, 3]", {"W_Q": st["W_Q"], "W_K": st["W_K"], "W_V": st["W_V"]}),
        Step("q", "Queries Q = x W_Q", "", "[3, 3]", {"q": st["q"]}, inputs),
        Step("k", "Keys K = x W_K", "", "[3, 3]", {"k": st["k"]}, inputs),
        Step("v", "Values V = x W_V", "", "[3, 3]", {"v": st["v"]}, inputs),
        Step("scores", "Scores = Q K^T", "Row i holds query i's dot product with every key.", "[3, 3]",
             {"scores": st["scores"]}, inputs, inputs),
        Step("scaled", "Scale", f"Then {how}.", "[3, 3]", {"scaled": st["scaled"]}, inputs, inputs),
        Step("weights", "Softmax", "Each row becomes a probability distribution (row sums shown).", "[3, 3]",
             {"weights": st["weights"], "row sums": st["weights"].sum(-1, keepdims=True)}, inputs, inputs),
        Step("context", "Output = weights V", "Each output is the weighted sum of the value vectors.",
             "[3, 3]", {"context": st["context"]}, inputs),
    ]
    model = {"name": "toy example", "layers": 1, "heads": 1, "d_head": 3, "scaled": scale}
    return Walkthrough(model, 0, 0, None, [], steps, {})
