"""What a search's matches have in common, as exBERT summarises them: their UD part of speech and dependency
relation, and where they sit in their sentences (torch-free)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# token positions grouped as a person reads them: the first tokens one by one, then wider bins
POSITION_BINS = ((0, 0), (1, 1), (2, 2), (3, 4), (5, 9), (10, 19), (20, 39), (40, 79), (80, None))


@dataclass(frozen=True, kw_only=True)
class MatchSummary:
    """Counts over the matches: UD UPOS, UD DEPREL (where the corpus has them), token positions (0-indexed, binned),
    and the matched tokens' own texts. Each dict is ordered by count, then by label."""

    total: int
    upos: dict[str, int]
    deprel: dict[str, int]
    position: dict[str, int]  # bin label ("0", "3-4", "80+") -> count, in position order
    token: dict[str, int]

    def to_dict(self) -> dict[str, Any]:
        return {"total": self.total, "upos": self.upos, "deprel": self.deprel, "position": self.position,
                "token": self.token}


def position_bin(position: int) -> str:
    """The bin label of a 0-indexed token position: "0", "1", "2", "3-4", "5-9", ..., "80+"."""
    for low, high in POSITION_BINS:
        if high is None:
            return f"{low}+"
        if low <= position <= high:
            return str(low) if low == high else f"{low}-{high}"
    raise AssertionError("the last bin is open")


def summarise(upos: Sequence[str | None], deprel: Sequence[str | None], positions: Sequence[int],
              tokens: Sequence[str]) -> MatchSummary:
    """The summary of matches given each one's UPOS, DEPREL (None: no annotation), position and token text."""
    bins = Counter(position_bin(p) for p in positions)
    order = [position_bin(low) for low, _ in POSITION_BINS]
    return MatchSummary(total=len(positions), upos=_ranked(u for u in upos if u is not None),
                        deprel=_ranked(d for d in deprel if d is not None),
                        position={b: bins[b] for b in order if bins[b]}, token=_ranked(tokens))


def _ranked(labels: Any) -> dict[str, int]:
    counts = Counter(labels)
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


__all__ = ["MatchSummary", "position_bin", "summarise"]
