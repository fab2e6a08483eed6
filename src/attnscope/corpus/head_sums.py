"""What a heads pass accumulates over a corpus, per sentence: the pairwise Jensen-Shannon distance of every two heads'
attention rows, and each head's behaviour (torch-free).

Heads are numbered as units `u = layer * n_heads + head` (0-indexed). For one sentence, P[u, t] is head u's attention
row of query token t, a distribution over the sentence's keys. The distance of heads a and b on token t is the
Jensen-Shannon distance (natural log, as scipy.spatial.distance.jensenshannon):

    JS(p, q) = sqrt(H(m) - (H(p) + H(q)) / 2),  m = (p + q) / 2,  H the Shannon entropy in nats

and the distance of the two heads over a corpus is its mean over every real token (Clark et al. 2019 cluster heads by
the same divergence, summed over tokens). H(m) - (H(p) + H(q)) / 2 is >= 0 exactly; computed in float64 it can come
out below 0 by rounding (a few 1e-16 for p = q). Values down to -ROUNDING are taken as 0 (documented here, not
silent); anything lower is an error.

Each head's behaviour per token, summed with its count (means over the corpus are sum / count):
- `previous`, `next`: the weight on the key just before / after the query (rows that have one);
- `first_special`: the weight on the first token or on special tokens ([CLS], [SEP], <s>: the sink);
- `self`: the weight on the query's own token;
- `entropy`: the row's entropy (nats); `broadness`: the entropy over log(keys the row may see), 0 (one key) to 1
  (uniform), rows that see two keys or more: comparable across lengths, models and causal or bidirectional heads.

Sums are float64, added sentence by sentence in the corpus' order, so a resumed pass that restarts from a checkpoint
of the exact sums gives the same bits as an uninterrupted one.
"""

from __future__ import annotations

import io
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from scipy.special import entr

from attnscope.errors import AttnscopeError

FILE = "heads.npz"  # a heads pass's sums and metadata, in its output directory
ROUNDING = 1e-12  # how far below 0 a Jensen-Shannon divergence may come out by float64 rounding
FEATURES = ("previous", "next", "first_special", "self", "entropy", "broadness")
CHUNK_CELLS = 1 << 22  # float64 cells per block of the pairwise computation (32 MiB)


@dataclass(kw_only=True)
class HeadSums:
    """Float64 sums over the tokens seen so far: `js` [unit, unit] of per-token JS distances, `features[name]` [unit]
    and `counts[name]` (the tokens each feature's sum holds; the same for every head). Mergeable: `merge` adds."""

    layers: int
    heads: int
    tokens: int = 0
    documents: int = 0
    js: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    features: dict[str, np.ndarray] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        units = self.layers * self.heads
        if self.js.shape != (units, units):
            self.js = np.zeros((units, units), dtype=np.float64)
        for name in FEATURES:
            self.features.setdefault(name, np.zeros(units, dtype=np.float64))
            self.counts.setdefault(name, 0)

    @property
    def units(self) -> int:
        return self.layers * self.heads

    def merge(self, other: HeadSums) -> None:
        """Add another pass's (or sentence's) sums into these, in place: float64 sums, so the order of merges is the
        order of the bits (the heads pass merges its sentences in corpus order)."""
        self.js += other.js
        for name in FEATURES:
            self.features[name] += other.features[name]
            self.counts[name] += other.counts[name]
        self.tokens += other.tokens
        self.documents += other.documents

    def distance(self) -> np.ndarray:
        """[unit, unit] the mean JS distance over the tokens (0 on the diagonal)."""
        if self.tokens == 0:
            raise AttnscopeError("no tokens were read: the head distances are not defined")
        return self.js / self.tokens

    def means(self) -> dict[str, np.ndarray]:
        """Each behaviour's mean over the tokens it is defined on: name -> [unit] (NaN where no token has it)."""
        return {n: self.features[n] / self.counts[n] if self.counts[n] else np.full(self.units, np.nan)
                for n in FEATURES}


def js_pairs(p: np.ndarray) -> np.ndarray:
    """The JS distance between every two heads on every token: p [unit, token, key] (rows summing to 1, float64) ->
    [token, unit, unit] (module docstring; symmetric, exactly 0 on the diagonal). Each pair is computed once, and a
    block of tokens only over the keys it weighs (a causal row t: keys 0..t), since entr(0) = 0."""
    units, tokens, keys = p.shape
    h = entr(p).sum(-1)  # [unit, token]
    ia, ib = np.triu_indices(units, 1)  # the pairs a < b
    out = np.zeros((tokens, units, units), dtype=np.float64)
    used = (p != 0).any(0)  # [token, key]
    last = np.where(used.any(1), keys - np.argmax(used[:, ::-1], axis=1), 0)  # [token] keys up to the last weighed
    step = max(1, CHUNK_CELLS // max(1, len(ia) * keys))
    for t0 in range(0, tokens, step):
        t1 = min(tokens, t0 + step)
        k = int(last[t0:t1].max())
        rows = p[:, t0:t1, :k].transpose(1, 0, 2)  # [token, unit, key]
        hm = entr((rows[:, ia] + rows[:, ib]) / 2).sum(-1)  # [token, pair]
        hh = h[:, t0:t1].T  # [token, unit]
        js = hm - (hh[:, ia] + hh[:, ib]) / 2
        out[t0:t1, ia, ib] = js
        out[t0:t1, ib, ia] = js
    low = float(out.min()) if out.size else 0.0
    if low < -ROUNDING:
        raise AttnscopeError(f"internal: a Jensen-Shannon divergence of {low:.3g} (below 0 by more than rounding): "
                             "the attention rows do not sum to 1")
    return np.sqrt(np.maximum(out, 0.0))


def add_sentence(sums: HeadSums, p: np.ndarray, special: np.ndarray, causal: bool) -> None:
    """Fold one sentence's attention into sums. p: [unit, token, key] (keys = the sentence's tokens; each row sums
    to 1 over the keys it may see); special: bool [token]; causal: row t sees keys 0..t (else all)."""
    units, n, _ = p.shape
    if units != sums.units or p.shape[2] != n:
        raise AttnscopeError(f"internal: attention of shape {p.shape} for {sums.units} heads")
    p = np.asarray(p, dtype=np.float64)
    sums.js += js_pairs(p).sum(0)
    t = np.arange(n)
    sink = special.astype(bool) | (t == 0)  # [key]
    entropy = entr(p).sum(-1)  # [unit, token]
    seen = t + 1 if causal else np.full(n, n)  # keys each row may see
    wide = seen >= 2
    parts = {
        "previous": (p[:, t[1:], t[1:] - 1], n - 1),
        "next": (p[:, t[:-1], t[:-1] + 1], n - 1),
        "first_special": (p[:, :, sink].sum(-1), n),
        "self": (p[:, t, t], n),
        "entropy": (entropy, n),
        "broadness": (entropy[:, wide] / np.log(seen[wide]), int(wide.sum())),
    }
    for name, (values, count) in parts.items():
        sums.features[name] += values.sum(-1)
        sums.counts[name] += count
    sums.tokens += n
    sums.documents += 1


# --- the pass's file: one .npz, written atomically (the sums, the position and what the run is, together) ---------

def save(path: Path, sums: HeadSums, meta: dict[str, Any]) -> None:
    """Write sums and meta (JSON-able: identity, position, syntax counts, complete) to path atomically."""
    info = {**meta, "layers": sums.layers, "heads": sums.heads, "tokens": sums.tokens, "documents": sums.documents,
            "counts": sums.counts}
    arrays: dict[str, Any] = {"meta": np.array(json.dumps(info)), "js": sums.js,
                              **{f"feature.{n}": v for n, v in sums.features.items()}}
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as handle:
        handle.write(buffer.getvalue())
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def load(path: str | os.PathLike[str]) -> tuple[HeadSums, dict[str, Any]]:
    """The sums and meta of a heads file, or one line saying why it cannot be read."""
    p = Path(path)
    try:
        with np.load(p, allow_pickle=False) as data:
            meta: dict[str, Any] = json.loads(str(data["meta"]))
            sums = HeadSums(layers=int(meta["layers"]), heads=int(meta["heads"]), tokens=int(meta["tokens"]),
                            documents=int(meta["documents"]), js=np.array(data["js"]),
                            features={n: np.array(data[f"feature.{n}"]) for n in FEATURES},
                            counts={n: int(meta["counts"][n]) for n in FEATURES})
    except FileNotFoundError as exc:
        raise AttnscopeError(f"{p} does not exist: run attnscope heads SOURCE -o DIR first") from exc
    except (OSError, ValueError, KeyError, TypeError, json.JSONDecodeError) as exc:
        raise AttnscopeError(f"{p} is not a heads file of this attnscope ({exc}): run attnscope heads again") from exc
    if sums.js.shape != (sums.units, sums.units):
        raise AttnscopeError(f"{p} is damaged: its distances are {sums.js.shape} for {sums.units} heads")
    return sums, meta


__all__ = ["FEATURES", "FILE", "ROUNDING", "HeadSums", "add_sentence", "js_pairs", "load", "save"]
