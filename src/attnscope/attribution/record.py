"""The result of an attribution (torch-free): per method, a score for each input token and each target token,
the check that stands beside those scores, and what they cost.

Scores are float64 [target, token]: row t says how much each input token carries target t (a log-probability, a
cosine similarity, or a share of the attention mixing: `unit` says which). A check is verified (True), failed
(False) or NOT VERIFIED (None, with the reason in `detail`); the exit codes follow `attnscope check`'s.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from attnscope.numbers import finite_or_null
from attnscope.records.check_report import EXIT_CODES, FAIL, NOT_VERIFIED, PASS
from attnscope.tokens import Token


@dataclass(frozen=True, kw_only=True)
class MethodCheck:
    """What was checked beside a method's scores: value against bound (value <= bound passes)."""

    name: str  # e.g. "completeness", "unperturbed forward", "attention recompute"
    value: float  # the measured error (NaN where nothing was measured)
    bound: float
    verified: bool | None  # None: NOT VERIFIED (detail says why)
    detail: str  # one line: what was compared with what

    @property
    def status(self) -> str:
        return NOT_VERIFIED if self.verified is None else PASS if self.verified else FAIL

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status, "value": self.value, "bound": self.bound,
                "verified": self.verified, "detail": self.detail}


@dataclass(frozen=True, kw_only=True)
class Cost:
    """What a method ran: forward and backward passes of one sequence each (a batch of 8 counts 8), and time."""

    forwards: int
    backwards: int
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return {"forwards": self.forwards, "backwards": self.backwards, "seconds": self.seconds}


@dataclass(frozen=True, kw_only=True)
class MethodScores:
    """One method's scores [target, token] (float64), their unit, its check, its cost and its settings."""

    method: str
    scores: np.ndarray  # float64 [target, token]
    unit: str  # what a score measures, e.g. "log-prob difference (nats)"
    check: MethodCheck
    cost: Cost
    settings: dict[str, Any] = field(default_factory=dict)  # e.g. {"steps": 64, "baseline": "[MASK]"}
    # token index -> why the method gives it no score (its column is NaN in every target's row, null in JSON), e.g.
    # leave-one-out and an encoder-decoder's decoder start token, which the user did not give and cannot take away
    unscored: dict[int, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.method, "unit": self.unit, "scores": self.scores.tolist(),
                "check": self.check.to_dict(), "cost": self.cost.to_dict(), "settings": self.settings,
                "unscored": {str(i): why for i, why in sorted(self.unscored.items())}}


@dataclass(frozen=True, kw_only=True)
class Attribution:
    """Which input tokens carry each target, by every method asked for, on one input of one model."""

    model: str
    architecture: str
    kind: str  # "causal" | "seq2seq" | "encoder": what is explained
    description: str  # one line, e.g. "log p(' Paris' | 'The capital of France is')"
    tokens: list[Token]  # the input tokens scored (encoder-decoders: the source's, then the decoder input's)
    targets: list[str]  # one per row of every method's scores
    methods: dict[str, MethodScores]
    skipped: dict[str, str] = field(default_factory=dict)  # method -> why it does not apply (not named explicitly)

    @property
    def status(self) -> str:
        """FAIL if any check failed, else NOT VERIFIED if any was not verified, else PASS."""
        statuses = {m.check.status for m in self.methods.values()}
        return FAIL if FAIL in statuses else NOT_VERIFIED if NOT_VERIFIED in statuses else PASS

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.status]

    def scores(self, method: str) -> np.ndarray:
        """float64 [target, token] for one method."""
        return self.methods[method].scores

    def rank_agreement(self, target: int = 0) -> np.ndarray:
        """Spearman's rho between every two methods' scores of one target over the tokens: float64 [method, method]
        in the order of `methods`. Tokens some method leaves unscored (`ranked_tokens`) are left out for every
        method, so all rank the same tokens; NaN where a row still holds NaN or is constant: no ranking to
        compare."""
        if not self.methods:
            return np.zeros((0, 0))
        rows = np.stack([m.scores[target] for m in self.methods.values()])  # [method, token]
        return spearman(rows[:, self.ranked_tokens()])

    def ranked_tokens(self) -> list[int]:
        """The token indices rank_agreement compares over: every token but those a method left unscored."""
        left_out = {i for m in self.methods.values() for i in m.unscored}
        return [i for i in range(len(self.tokens)) if i not in left_out]

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "architecture": self.architecture, "kind": self.kind,
                "description": self.description, "tokens": [t.to_dict() for t in self.tokens],
                "targets": self.targets, "status": self.status,
                "methods": {name: m.to_dict() for name, m in self.methods.items()}, "skipped": self.skipped,
                "rank_agreement": [self.rank_agreement(t).tolist() for t in range(len(self.targets))]}

    # Views (attnscope.views.attribution): the heatmap, a token's ranks and the methods' agreement as a page.
    def to_html(self, colours: str = "method", raw_tokens: bool = False) -> str:
        """A self-contained HTML page of this attribution (file://, no network)."""
        from attnscope.views.attribution import attribution_html

        return attribution_html(self, colours, raw_tokens)

    def _repr_html_(self) -> str:
        """Jupyter: the view in an isolated frame."""
        from attnscope.views.attribution import attribution_page

        return attribution_page(self)._repr_html_()

    def figure(self, path: str | os.PathLike[str], **options: Any) -> Path:
        """The view as a figure (svg, png or pdf from the suffix; options: attribution_figure's)."""
        from attnscope.views.attribution import attribution_figure

        return attribution_figure(self, path, **options)

    def to_json(self) -> dict[str, Any]:
        """to_dict with NaN and infinities as null (strict JSON)."""
        data: dict[str, Any] = finite_or_null(self.to_dict())
        return data


def spearman(rows: np.ndarray) -> np.ndarray:
    """Spearman's rho between every two rows of [row, item] (ties share their mean rank): [row, row], float64;
    NaN for a row with a NaN or with one value throughout."""
    from scipy.stats import rankdata  # type: ignore[import-untyped]

    rows = np.asarray(rows, dtype=np.float64)
    ok = np.isfinite(rows).all(axis=1) & (np.ptp(rows, axis=1) > 0 if rows.size else np.zeros(len(rows), bool))
    ranks = np.array([rankdata(r) if good else np.full(r.shape, np.nan) for r, good in zip(rows, ok, strict=True)])
    if not len(ranks):
        return np.zeros((0, 0))
    centred = ranks - ranks.mean(axis=1, keepdims=True)
    norms = np.sqrt((centred**2).sum(axis=1))
    rho: np.ndarray = (centred @ centred.T) / np.outer(norms, norms)
    return rho
