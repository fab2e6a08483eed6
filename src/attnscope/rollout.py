"""Attention rollout and attention flow (Abnar & Zuidema 2020): attention traced across layers.

Raw weights say where one layer looks, but the residual connection carries each token's own
state past every layer, and layer l mixes what layer l-1 already mixed. Both methods model
this with one matrix per layer, the head mean with the residual added:

    A-bar_l = mean over heads of weights_l              # [query, key]
    A-hat_l = 0.5 A-bar_l + 0.5 I, rows renormalised   # [query, key]

Rollout multiplies them (R_1 = A-hat_1, R_l = A-hat_l R_(l-1)): the share of each input
token in each position after layer l, if mixing were linear. Flow treats the layers as a
network whose edge capacities are A-hat and takes, for each top-layer position, the max-flow
to each input position: the most that can get through the narrowest cut, not the product.

Layers are 0-indexed in arrays: rollout[l] is R_(l+1), the rollout after layer l.
"""

from __future__ import annotations

import logging

import numpy as np

from attnscope.errors import AttnscopeError

log = logging.getLogger(__name__)

MAX_FLOW_TOKENS = 64
# Max-flow needs integer capacities: A-hat is scaled by 2^30 and rounded, which moves each
# capacity by at most 2^-31 (below float32's resolution of the weights near 1, 6e-8).
FLOW_SCALE = 2**30


def validate_weights(weights: np.ndarray, what: str = "weights") -> np.ndarray:
    """Validate attention weights [layer, head, query, key]: square, finite, non-negative."""
    w = np.asarray(weights)
    if w.ndim != 4 or w.shape[2] != w.shape[3] or 0 in w.shape:
        raise AttnscopeError(
            f"{what} must have axes [layer, head, query, key] with query == key, got shape {list(w.shape)}"
        )
    bad = ~np.isfinite(w)
    if bad.any():
        layer, head, query, key = (int(i) for i in np.argwhere(bad)[0])
        raise AttnscopeError(
            f"{what} hold NaN or infinity (first at layer {layer}, head {head}, query {query}, "
            f"key {key}; 0-indexed): the trace is broken, trace the text again"
        )
    if (w < 0).any():
        raise AttnscopeError(f"{what} hold negative values (min {float(w.min()):.3g}): attention weights "
                             "come from a softmax and are never negative; pass the weights stage")
    return w


def residual_attention(weights: np.ndarray) -> np.ndarray:
    """A-hat: the head mean plus the identity, rows renormalised.  [layer, head, query, key] -> [layer, query, key]"""
    w = validate_weights(weights).astype(np.float64)
    a_bar = w.mean(axis=1)  # [layer, query, key]
    a_hat: np.ndarray = 0.5 * a_bar + 0.5 * np.eye(w.shape[-1])
    renormalised: np.ndarray = a_hat / a_hat.sum(axis=-1, keepdims=True)  # a_bar rows sum to 1 unless masked
    return renormalised


def rollout(weights: np.ndarray) -> np.ndarray:
    """Attention rollout: R_1 = A-hat_1, R_l = A-hat_l R_(l-1).

    weights [layer, head, query, key] -> [layer, query, key], entry l the rollout after layer l
    (0-indexed); every row sums to 1.
    """
    a_hat = residual_attention(weights)
    out = np.empty_like(a_hat)
    out[0] = a_hat[0]
    for layer in range(1, a_hat.shape[0]):
        out[layer] = a_hat[layer] @ out[layer - 1]  # the higher layer multiplies from the left
    return out.astype(_float_dtype(weights))


def flow(weights: np.ndarray, max_tokens: int = MAX_FLOW_TOKENS) -> np.ndarray:
    """Attention flow: max-flow from each top-layer position to each input position, rows renormalised.

    weights [layer, head, query, key] -> [query, key]. The graph has one node per position and
    layer boundary; layer l's position i feeds layer l-1's position j with capacity A-hat_l[i, j].
    Cost grows like tokens^4 x layers, so texts longer than max_tokens are refused.
    """
    validate_flow_length(int(np.asarray(weights).shape[-1]) if np.ndim(weights) == 4 else 0, max_tokens)
    a_hat = residual_attention(weights)
    values = _max_flows(a_hat)  # [query, key]
    shares: np.ndarray = values / values.sum(axis=-1, keepdims=True)
    return shares.astype(_float_dtype(weights))


def validate_flow_length(n: int, max_tokens: int) -> None:
    """Refuse attention flow over more than max_tokens tokens (its cost grows like tokens^4)."""
    if n > max_tokens:
        raise AttnscopeError(
            f"attention flow over {n} tokens is refused: it solves a max-flow for each of the {n}x{n} token "
            f"pairs and its cost grows like tokens^4 (about 3 s at 64 tokens and 6 layers); shorten the text "
            f"to at most {max_tokens} tokens, or accept the cost with max_tokens={n}", parameter="max_tokens"
        )


def _max_flows(a_hat: np.ndarray) -> np.ndarray:
    """Max-flow value from each top position to each input position: [query, key] (unnormalised)."""
    try:
        from scipy.sparse import csr_array  # type: ignore[import-untyped]
        from scipy.sparse.csgraph import maximum_flow  # type: ignore[import-untyped]
    except ImportError as exc:
        raise AttnscopeError("attention flow needs scipy: pip install scipy (or attnscope[stats])") from exc
    n_layers, n, _ = a_hat.shape
    if n_layers == 1:
        return np.array(a_hat[0])  # one layer: each edge is the only path
    caps = np.rint(a_hat * FLOW_SCALE).astype(np.int32)  # [layer, query, key]
    indptr, indices = _layered_graph(n_layers, n)
    reach = _reachable(caps)  # skip pairs with no path at all (the future, in causal models)
    middle = caps[1:-1].reshape(-1)
    values = np.zeros((n, n))
    for u, v in zip(*np.nonzero(reach), strict=True):
        data = np.concatenate([caps[0][:, v], middle, caps[-1][u]])
        graph = csr_array((data, indices, indptr), shape=(len(indptr) - 1,) * 2)
        values[u, v] = maximum_flow(graph, len(indptr) - 2, 0).flow_value
    log.debug("attention flow: %d max-flows over %d layers x %d tokens", int(reach.sum()), n_layers, n)
    return values / FLOW_SCALE


def _layered_graph(n_layers: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """CSR structure of the network for one (source, sink) pair; only the capacities change per pair.

    Nodes: 0 the sink (one input position); 1 + (l-1) n + j position j after layer l, for
    l = 1 .. n_layers-1; last the source (one top-layer position). Positions after layer 1
    each have one edge, to the sink; the source has one edge to each position after the
    second-to-last layer. Other inputs and other top positions cannot carry flow and are left out.
    """
    rows = [np.zeros(1, dtype=np.int32)] * n  # after layer 1 -> the sink
    for layer in range(2, n_layers):
        rows += [1 + (layer - 2) * n + np.arange(n, dtype=np.int32)] * n  # after layer l -> after layer l-1
    rows.append(1 + (n_layers - 2) * n + np.arange(n, dtype=np.int32))  # the source -> after layer L-1
    lengths = [0, 0] + [len(r) for r in rows]  # the sink has no out-edges
    return np.cumsum(lengths, dtype=np.int32), np.concatenate(rows)


def _reachable(caps: np.ndarray) -> np.ndarray:
    """[query, key]: whether any path of positive capacities joins top position query to input key."""
    reach: np.ndarray = caps[0] > 0
    for layer in range(1, caps.shape[0]):
        reach = ((caps[layer] > 0).astype(np.int64) @ reach.astype(np.int64)) > 0
    return reach


def _float_dtype(weights: np.ndarray) -> np.dtype[np.floating]:
    dtype = np.asarray(weights).dtype
    return dtype if np.issubdtype(dtype, np.floating) else np.dtype(np.float64)
