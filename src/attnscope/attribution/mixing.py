"""The record the decomposition methods share: one mixing matrix per layer, and their product.

ALTI (`attribution.alti`), norm-based attention (`attribution.norm_based`) and value zeroing
(`attribution.value_zeroing`) each say, per layer, how much position i's output of that layer takes from
each position j of that layer's input: a matrix [token, token] whose rows sum to 1. Across layers they are
aggregated by rollout (Abnar & Zuidema 2020), as each method's paper does: the product of the layers'
matrices, the higher layer multiplying from the left. No residual is added here: ALTI and value zeroing
already account for the residual inside their per-layer matrices, and the norm-based matrices are rolled
out as given (the method's module says how it treats the residual).

Torch-free: a plain record, like the ones in attnscope.records.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

METHOD_NAMES = ("alti", "norm", "value_zeroing")


@dataclass(frozen=True)
class LayerMixing:
    """Per-layer token-to-token mixing from one decomposition method, with the check it passed or failed.

    matrices: row i of layer l = how much position i's output of layer l takes from each position j of
    layer l's input; rows sum to 1 (each method documents how it gets there).
    max_error: the check's error per layer (NaN where a layer was not checked).
    verified: True = every layer's error is within bound; False = one is not; None = NOT VERIFIED
    (detail says why).
    """

    method: str  # "alti" | "norm" | "value_zeroing"
    matrices: np.ndarray  # float64 [layer, token, token]
    max_error: np.ndarray  # float64 [layer]
    bound: float  # the tolerance the check used
    verified: bool | None  # None: NOT VERIFIED (detail says why)
    detail: str  # one line: what was checked and how
    forwards: int  # extra forward passes the method ran

    def rolled(self) -> np.ndarray:
        """The layers' matrices multiplied, last @ ... @ first: [token, token], row i = how much the top
        layer's position i takes from each input position j."""
        out = self.matrices[0]
        for layer in range(1, self.matrices.shape[0]):
            out = self.matrices[layer] @ out  # [token, token]: the higher layer multiplies from the left
        return np.asarray(out, dtype=np.float64)

    @property
    def layers(self) -> int:
        return int(self.matrices.shape[0])

    @property
    def tokens(self) -> int:
        return int(self.matrices.shape[-1])


def verdict(max_error: np.ndarray, bound: float) -> bool | None:
    """True when every checked layer's error is within bound, False when one is not; None when no layer was
    checked (every entry NaN, the plan's mark for "unchecked")."""
    errors = np.asarray(max_error, dtype=np.float64)
    checked = errors[~np.isnan(errors)]
    if checked.size == 0:
        return None
    return bool(np.all(checked <= bound))


def normalise_rows(matrix: np.ndarray) -> np.ndarray:
    """Each row divided by its sum ([..., token, token]). A row summing to 0 is left as it is and does not
    sum to 1 (the caller's check reports it) rather than being quietly turned into NaN or a uniform row."""
    m = np.asarray(matrix, dtype=np.float64)
    sums = m.sum(axis=-1, keepdims=True)
    safe = np.where(sums == 0.0, 1.0, sums)
    out: np.ndarray = m / safe
    return out


__all__ = ["METHOD_NAMES", "LayerMixing", "normalise_rows", "verdict"]
