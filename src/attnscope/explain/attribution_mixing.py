"""The mixing walkthroughs: ALTI and value zeroing (one layer's decomposition, then the rollout over layers), raw
attention and attention rollout (attnscope.explain.attribution calls these; each returns a `Built`).

ALTI's layer is recomputed from engineer B's pieces (attribution.blocks.capture_blocks, alti.transformed_vectors)
and its distances and clip written out here in float64, then compared with alti()'s own LayerMixing; value
zeroing's layer is run through value_zeroing's own functions (the real layer module called alone, zeroing
through the registered attention function) and compared with value_zeroing()'s LayerMixing. The rollout's last
product is written out term by term and its result compared with attribute()'s score.
"""

from __future__ import annotations

import numpy as np
import torch

from attnscope.attribution.alti import alti as alti_mixing
from attnscope.attribution.alti import block_error, transformed_vectors
from attnscope.attribution.blocks import LayerBlock, capture_blocks
from attnscope.attribution.value_zeroing import (
    ValueZeroing,
    cosine_distance,
    layer_modules_of,
    layer_outputs,
    unchanged_error,
    zeroed_output,
)
from attnscope.attribution.value_zeroing import value_zeroing as value_zeroing_mixing
from attnscope.explain.attribution_common import SAME, Built, Walk, check, dim_labels, head_dims
from attnscope.explain.steps import Step
from attnscope.maths import expand_kv
from attnscope.rollout import residual_attention

MIXED_SAME = 1e-9  # a contribution recomputed here in float64 against the module's float64 one
ALTI_SAME = 1e-5  # ALTI here (float64, whole) against alti() (float32 distances by the numba kernel)
ROLLOUT_SAME = 1e-6  # attention rollout: attribute() reads the trace's rollout, rounded to float32


def _layer(walk: Walk) -> int:
    return int(walk.obj.model.n_layers) - 1 if walk.layer is None else walk.layer


def _focus(walk: Walk) -> int:
    """The output row a layer's step shows: the predicting position, or token I for an encoder (mean pooling)."""
    return walk.token if walk.row is None else walk.row


def _row_text(walk: Walk) -> str:
    if walk.row is None:
        return (f"position i = {walk.label} (an encoder's score is the mean over rows, as mean pooling weighs "
                "them; token I's own row is shown)")
    return f"position i = {walk.labels[walk.row]}, whose output predicts {walk.obj.targets[0]!r}"


def alti(walk: Walk) -> Built:
    obj, layer, i = walk.obj, _layer(walk), _focus(walk)
    block = capture_blocks(obj.model, obj.inputs(), whole_block=True)[layer]
    t, bias = transformed_vectors(block)  # [query, key, d_model], [query, d_model]
    error = block_error(block, t, bias)
    mixing = alti_mixing(obj.model, obj.inputs())
    y = t[i].sum(dim=0) + bias[i]  # [d_model]: the decomposition's y_i
    distance = (y[None] - t[i]).abs().sum(dim=-1)  # [key]: ||y_i - T_i(x_j)||_1
    norm = float(y.abs().sum())  # ||y_i||_1
    clipped = (norm - distance).clamp(min=0.0)  # [key]
    ours = (clipped / clipped.sum()).cpu().numpy()  # [key]: c_ij
    theirs = mixing.matrices[layer, i]
    steps = [_block_step(walk, block, layer, i), _vectors_step(walk, t[i], bias[i], block, layer, i, error),
             _distances_step(walk, distance, norm, clipped, ours, theirs, layer, i),
             *rollout_steps(walk, mixing.matrices, "ALTI's contributions C_l")]
    final = rolled_score(walk, mixing.matrices)
    checks = [check(f"sum of T_i(x_j) = block output (layer {layer})", error, mixing.bound,
                    f"sum_j T_i(x_j) + bias_i against the captured block output, every position of layer {layer}, "
                    "relative to max(1, max |y|)"),
              check(f"contributions = alti()'s (layer {layer})", float(np.abs(ours - theirs).max()), ALTI_SAME,
                    f"row {i} of layer {layer}: the distances and clip written out here against alti()'s LayerMixing")]
    return steps, final, checks, layer, SAME


def _block_step(walk: Walk, block: LayerBlock, layer: int, i: int) -> Step:
    assert block.block_output is not None
    post = block.norm is not None
    form = ("post-norm (BERT): y_i = LayerNorm(x_i + sum_h sum_j alpha^h_ij f^h(x_j) + b_O); LayerNorm is applied "
            "to each source's share as the linear map 'centre, scale by gamma / sigma_i', sigma_i the full sum's "
            "statistic, so the shares add up exactly" if post else
            "pre-norm: y_i = x_i + sum_h sum_j alpha^h_ij f^h(norm(x_j)) + b_O, the residual stream after the "
            "attention (what enters the layer's second norm)")
    text = (f"ALTI (Ferrando et al. 2022) splits layer {layer}'s attention-block output y_i into one transformed "
            f"vector T_i(x_j) per source token j, f^h(x) = v^h W_O^h. The block is {form}. Shown: {_row_text(walk)}; "
            "y_i as captured from the real forward pass.")
    y = block.block_output[i]
    arr = np.concatenate([[[float(y.abs().sum())]], head_dims(y[None])], axis=1)
    shape = f"[token, d_model] = {list(block.block_output.shape)}"
    return Step("block", f"Layer {layer}'s attention block", text, shape,
                {"y_i (captured)": arr},
                array_labels={"y_i (captured)": ([walk.labels[i]], ["|y_i|_1", *dim_labels()])})


def _vectors_step(walk: Walk, t_i: torch.Tensor, bias_i: torch.Tensor, block: LayerBlock, layer: int, i: int,
                  error: float) -> Step:
    assert block.block_output is not None
    total = t_i.sum(dim=0) + bias_i
    captured = block.block_output[i]
    vectors = np.concatenate([t_i.abs().sum(dim=-1, keepdim=True).cpu().numpy(), head_dims(t_i)], axis=1)
    sums = np.concatenate([np.asarray([[float(v.abs().sum())] for v in (bias_i, total, captured, total - captured)]),
                           head_dims(torch.stack([bias_i, total, captured, total - captured]))], axis=1)
    text = (f"T_i(x_j) for every source j (the residual x_i goes to j = i), and the part no source owns (the biases). "
            f"Their sum is y_i: here its largest difference from the captured y_i is "
            f"{float((total - captured).abs().max()):.1e}; over all of layer {layer}, {error:.1e} relative to "
            "max(1, max |y|).")
    return Step("transformed", "The transformed vectors T_i(x_j)", text, f"[key, d_model] = {list(t_i.shape)}",
                {"T_i(x_j)": vectors, "sum": sums},
                array_labels={"T_i(x_j)": (walk.labels, ["|T|_1", *dim_labels()]),
                              "sum": (["bias_i", "sum_j T + bias", "captured y_i", "difference"],
                                      ["|.|_1", *dim_labels()])})


def _distances_step(walk: Walk, distance: torch.Tensor, norm: float, clipped: torch.Tensor, ours: np.ndarray,
                    theirs: np.ndarray, layer: int, i: int) -> Step:
    arr = np.stack([distance.cpu().numpy(), norm - distance.cpu().numpy(), clipped.cpu().numpy(), ours, theirs],
                   axis=1)  # [key, 5]
    j = walk.token
    text = (f"The paper's contributions: d_ij = ||y_i - T_i(x_j)||_1, then c_ij = max(0, ||y_i||_1 - d_ij) / "
            f"sum_k max(0, ||y_i||_1 - d_ik): a source whose vector is farther from y_i than the origin is clipped "
            f"to 0, and the row is normalised to sum to 1. ||y_i||_1 = {norm:.6g}; for token I: d = "
            f"{float(distance[j]):.6g}, {norm:.6g} - {float(distance[j]):.6g} = {norm - float(distance[j]):.6g}, "
            f"clipped {float(clipped[j]):.6g}, / {float(clipped.sum()):.6g} = {ours[j]:.6g} (alti()'s: "
            f"{theirs[j]:.6g}).")
    return Step("contributions", f"Distances and contributions (layer {layer}, row {i})", text,
                f"[key] = [{len(ours)}]", {"c_ij": arr},
                array_labels={"c_ij": (walk.labels, ["d_ij", "|y|_1-d_ij", "clipped", "c_ij", "alti()"])})


def rolled_score(walk: Walk, matrices: np.ndarray) -> float:
    """Token I's score from per-layer matrices [layer, query, key]: the rolled row (or mean of rows), column I."""
    rolled = matrices[0]
    for m in matrices[1:]:
        rolled = m @ rolled  # [query, key]: the higher layer multiplies from the left
    column = rolled[:, walk.token]
    return float(column.mean() if walk.row is None else column[walk.row])


def rollout_steps(walk: Walk, matrices: np.ndarray, what: str) -> list[Step]:
    """The rollout R_l = M_l R_(l-1) over layers: token I's share layer by layer, and the last product written out."""
    i, n_layers = walk.token, matrices.shape[0]
    rolled = [matrices[0]]
    for m in matrices[1:]:
        rolled.append(m @ rolled[-1])  # [query, key]
    mean = walk.row is None
    per_layer = np.asarray([[matrices[lay][:, i].mean() if mean else matrices[lay][walk.row, i],
                             rolled[lay][:, i].mean() if mean else rolled[lay][walk.row, i]]
                            for lay in range(n_layers)])
    where = "the mean over rows" if mean else f"row {walk.labels[walk.row or 0]}"
    text = (f"Across layers the matrices are multiplied (rollout, Abnar & Zuidema 2020): R_0 = M_0, R_l = M_l "
            f"R_(l-1), the later layer on the left; M_l here is {what}. Token I's share, {where}, after each layer "
            "(0-indexed):")
    steps = [Step("rollout", "The rollout over layers", text, f"[layer] = [{n_layers}]", {"share of I": per_layer},
                  array_labels={"share of I": ([f"layer {lay}" for lay in range(n_layers)],
                                               ["M_l (this layer)", "R_l (rolled)"])})]
    return [*steps, _last_product(walk, matrices[-1], rolled[-2] if n_layers > 1 else np.eye(matrices.shape[-1]),
                                  rolled[-1])]


def _last_product(walk: Walk, top: np.ndarray, below: np.ndarray, rolled: np.ndarray) -> Step:
    i, last = walk.token, "the last layer"
    if walk.row is None:
        column = rolled[:, i]
        text = (f"The final score: an encoder's pooled embedding is the mean over positions, so token I's score is "
                f"the mean of R's column I: {float(column.mean()):.6g}.")
        return Step("score", "The final score", text, f"[query] = [{len(column)}]", {"R[:, I]": column[:, None]},
                    array_labels={"R[:, I]": (walk.labels, ["R(i, I)"])})
    p = walk.row
    terms = np.stack([top[p], below[:, i], top[p] * below[:, i]], axis=1)  # [key, 3]
    text = (f"The final score: R[{p}, I] = sum_k M_last[{p}, k] R_(last-1)[k, I], {last}'s row times the rollout "
            f"below it: {float(terms[:, 2].sum()):.6g}.")
    return Step("score", "The final score", text, f"[key] = [{len(terms)}]", {"terms": terms},
                array_labels={"terms": (walk.labels, [f"M_last({p},k)", "R_below(k,I)", "product"])})


def value_zeroing(walk: Walk) -> Built:
    obj, layer, i, j = walk.obj, _layer(walk), _focus(walk), walk.token
    m, inputs, n = obj.model, obj.inputs(), obj.n_tokens
    plain = layer_outputs(m, inputs)
    _, cap, calls = unchanged_error(m, inputs, plain, ValueZeroing([(-1, -1)], [], []))
    weights = [c.weights[0] for c in cap.calls]  # [head, query, key] per layer
    v = [expand_kv(c.v[0], c.weights.shape[1] // c.v.shape[1]) for c in cap.calls]  # [head, key, d_head]
    edit = ValueZeroing([(-1, -1), *((layer, k) for k in range(n))], weights, v, first=layer)
    out = zeroed_output(m, layer_modules_of(m.model)[layer], calls[layer], edit)  # [1 + key, token, d_model]
    distances = np.stack([cosine_distance(out[0], out[r]) for r in range(1, n + 1)], axis=1)  # [query, key]
    row = distances[i] / distances[i].sum()
    mixing = value_zeroing_mixing(m, inputs)
    theirs = mixing.matrices[layer, i]
    steps = [_zeroed_step(walk, weights[layer], v[layer], layer, i),
             _changed_step(walk, out[0], out[1 + j], distances[:, j], layer, i),
             _row_step(walk, distances[i], row, theirs, layer, i),
             *rollout_steps(walk, mixing.matrices, "value zeroing's normalised distances")]
    checks = [check(f"row = value_zeroing()'s (layer {layer})", float(np.abs(row - theirs).max()), MIXED_SAME,
                    f"row {i} of layer {layer}, recomputed here, against value_zeroing()'s LayerMixing")]
    return steps, rolled_score(walk, mixing.matrices), checks, layer, SAME


def _zeroed_step(walk: Walk, weights: torch.Tensor, v: torch.Tensor, layer: int, i: int) -> Step:
    j = walk.token
    alpha = weights[:, i, j].double()  # [head]
    vj = v[:, j].double()  # [head, d_head]
    arr = np.concatenate([alpha[:, None].cpu().numpy(), (alpha[:, None] * vj).norm(dim=-1, keepdim=True).cpu().numpy(),
                          head_dims(vj)], axis=1)
    text = (f"Value zeroing (Mohebbi et al. 2023): token I's value vector v_I is set to 0 in every head of layer "
            f"{layer} only, and the layer is run again on its real input (the model's own layer module; the zeroing "
            f"happens inside the registered attention function). For {_row_text(walk)}, what disappears from head "
            "h's context is alpha^h_iI v^h_I:")
    return Step("zeroed", f"Token I's value vector, zeroed (layer {layer})", text,
                f"[head, d_head] = {list(vj.shape)}", {"v_I": arr},
                array_labels={"v_I": ([f"head {h}" for h in range(arr.shape[0])],
                                      ["alpha_iI", "|alpha v_I|", *dim_labels()])})


def _changed_step(walk: Walk, plain: torch.Tensor, zeroed: torch.Tensor, column: np.ndarray, layer: int,
                  i: int) -> Step:
    vecs = torch.stack([plain[i], zeroed[i], zeroed[i] - plain[i]])  # [3, d_model]
    arr = np.concatenate([vecs.double().norm(dim=-1, keepdim=True).cpu().numpy(), head_dims(vecs)], axis=1)
    text = (f"Layer {layer}'s output (attention block and feed-forward) of position {walk.labels[i]}, untouched and "
            f"with v_I zeroed; then each position's cosine distance 1 - cos(x~_i, x_i) with I zeroed (position "
            f"{walk.labels[i]}: {column[i]:.6g}).")
    return Step("changed", f"The changed layer output (layer {layer})", text, f"[d_model] = [{plain.shape[-1]}]",
                {"output": arr, "distance": column[:, None]},
                array_labels={"output": (["untouched x_i", "I zeroed x~_i", "difference"], ["|v|", *dim_labels()]),
                              "distance": (walk.labels, ["1 - cos"])})


def _row_step(walk: Walk, distances: np.ndarray, row: np.ndarray, theirs: np.ndarray, layer: int, i: int) -> Step:
    j = walk.token
    text = (f"Every token j zeroed in turn (one call of the layer over 1 + n rows): row {walk.labels[i]}'s distances, "
            f"divided by their sum {distances.sum():.6g} so the row sums to 1. Token I: {distances[j]:.6g} / "
            f"{distances.sum():.6g} = {row[j]:.6g} (value_zeroing()'s: {theirs[j]:.6g}).")
    return Step("normalised", f"The normalised row (layer {layer}, row {i})", text, f"[key] = [{len(row)}]",
                {"row": np.stack([distances, row, theirs], axis=1)},
                array_labels={"row": (walk.labels, ["1 - cos", "normalised", "value_zeroing()"])})


def raw_attention(walk: Walk) -> Built:
    from attnscope.attribution.attention import trace_of

    tr, layer = trace_of(walk.obj), int(walk.scores.settings["layer"])
    w = tr.weights[layer].astype(np.float64)  # [head, query, key]
    mean = w.mean(axis=0)  # [query, key]
    i = walk.token
    if walk.row is None:
        final, arr, rows = float(mean[:, i].mean()), mean, walk.labels
        how = "the mean over heads, then (an encoder) the mean over query rows of column I"
    else:
        final, arr, rows = float(mean[walk.row, i]), w[:, walk.row], [f"head {h}" for h in range(w.shape[0])]
        how = f"the mean over heads of row {walk.labels[walk.row]}, column I"
    text = (f"Raw attention: layer {layer}'s weights (from the verified trace), {how}: {final:.6g}.")
    step = Step("weights", f"Layer {layer}'s attention weights", text, f"[head, query, key] = {list(w.shape)}",
                {"weights": arr}, array_labels={"weights": (rows, walk.labels)})
    return [step], final, [], layer, SAME


def attention_rollout(walk: Walk) -> Built:
    from attnscope.attribution.attention import trace_of

    tr, layer = trace_of(walk.obj), int(walk.scores.settings["layer"])
    a_hat = residual_attention(tr.weights)[:layer + 1]  # [layer, query, key]
    text = ("Each layer's attention with the residual added (Abnar & Zuidema 2020): A-bar_l = the mean of the heads, "
            f"A-hat_l = 0.5 A-bar_l + 0.5 I, rows renormalised. Layer {layer}'s A-hat (0-indexed):")
    step = Step("residual", "Attention plus the residual", text, f"[query, key] = {list(a_hat.shape[1:])}",
                {f"A-hat_{layer}": a_hat[layer]}, row_labels=walk.labels, col_labels=walk.labels)
    steps = [step, *rollout_steps(walk, a_hat, "A-hat_l")]
    return steps, rolled_score(walk, a_hat), [], layer, ROLLOUT_SAME
