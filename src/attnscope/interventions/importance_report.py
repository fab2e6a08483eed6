"""The importance run's report: the pruning curve (heads removed least important first) and the rank
correlation between gradient importance and real one-head ablation on a sample of documents."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.nn import functional as F

from attnscope.capture import intervening
from attnscope.interventions.effects import Kind, kind_of
from attnscope.interventions.gates import HeadEdit, ones
from attnscope.interventions.importance import (
    ImportanceSettings,
    Sums,
    accumulate,
    normalised,
    row_losses,
    unit_embedding,
)
from attnscope.models import Model
from attnscope.tokens import encode

CURVE_POINTS = 11  # 0 %, 10 %, ..., 100 % of the heads removed


@dataclass
class Importance:
    """Head importance (0-indexed [layer, head]) and the checks of it on a sample."""

    model: str
    kind: Kind
    documents: int
    tokens: int
    raw: np.ndarray  # [layer, head]: E |d L / d g|
    normalised: np.ndarray  # [layer, head]: raw / ||raw[layer]||_2
    ablation: np.ndarray  # [layer, head]: the measure's mean change with that head removed, on the sample
    curve: list[tuple[int, float]]  # (heads removed, measure) in order of increasing importance
    spearman: float  # normalised importance vs |ablation effect|
    spearman_raw: float
    measure: str  # "loss" or "embedding_distance"
    sample: int

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "kind": self.kind, "documents": self.documents, "tokens": self.tokens,
                "measure": self.measure, "sample": self.sample, "raw": self.raw.tolist(),
                "normalised": self.normalised.tolist(), "ablation": self.ablation.tolist(),
                "curve": [list(p) for p in self.curve], "spearman": self.spearman, "spearman_raw": self.spearman_raw}


def measure_rows(m: Model, kind: Kind, inputs: dict[str, torch.Tensor], gates: torch.Tensor) -> torch.Tensor:
    """Per row: the loss (causal LMs) or the unit pooled embedding (encoders), with the gates applied."""
    with torch.no_grad(), intervening(m.model, HeadEdit(m.n_layers, gates)):
        return unit_embedding(m, inputs) if kind == "encoder" else row_losses(m, inputs)


def _per_doc(m: Model, kind: Kind, texts: Sequence[str], settings: ImportanceSettings,
             closed: torch.Tensor) -> np.ndarray:
    """closed [setting, layer, head] (1 = removed). Returns the measure's change per setting, averaged
    over documents: [setting]; setting 0 must be the untouched model."""
    n_set = int(closed.shape[0])
    changes = np.zeros(n_set)
    for text in texts:  # one document at a time: a batch of n_set rows
        inputs = {k: v.expand(n_set, -1) for k, v in encode(m.tokenizer, [text], max_length=settings.max_length)
                  .inputs.items()}
        gates = 1.0 - closed.permute(1, 0, 2).float()  # [layer, setting, head]
        values = measure_rows(m, kind, inputs, gates)
        if kind != "encoder":
            changes += (values - values[0]).double().numpy()
        else:
            changes += (1 - F.cosine_similarity(values, values[:1], dim=-1)).double().numpy()
    return changes / max(1, len(texts))


def one_head_ablation(m: Model, kind: Kind, texts: Sequence[str], settings: ImportanceSettings) -> np.ndarray:
    n_layers, n_heads = m.n_layers, m.n_heads
    closed = torch.zeros(1 + n_layers * n_heads, n_layers, n_heads)
    r = torch.arange(n_layers * n_heads)
    closed[1 + r, r // n_heads, r % n_heads] = 1.0
    return _per_doc(m, kind, texts, settings, closed)[1:].reshape(n_layers, n_heads)


def pruning_curve(m: Model, kind: Kind, texts: Sequence[str], settings: ImportanceSettings,
                  scores: np.ndarray) -> list[tuple[int, float]]:
    """The measure as heads are removed least important first, at CURVE_POINTS fractions of all heads."""
    n_layers, n_heads = scores.shape
    order = np.argsort(scores, axis=None, kind="stable")  # flat indices, least important first
    counts = sorted({round(f * scores.size) for f in np.linspace(0, 1, CURVE_POINTS)})
    closed = torch.zeros(len(counts), n_layers, n_heads)
    for i, k in enumerate(counts):
        closed[i].view(-1)[torch.from_numpy(order[:k].copy())] = 1.0
    changes = _per_doc(m, kind, texts, settings, closed)
    if kind != "encoder":  # the loss itself: the untouched model's mean loss plus each change
        base = float(np.mean([float(measure_rows(m, kind, encode(m.tokenizer, [t], max_length=settings.max_length)
                                                 .inputs, ones(m, 1))[0]) for t in texts]))
        changes = changes + base
    return [(int(k), float(v)) for k, v in zip(counts, changes, strict=True)]


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    from scipy.stats import spearmanr

    return float(spearmanr(a.ravel(), b.ravel()).statistic)


def importance(m: Model, texts: Sequence[str] | Any, outdir: str | os.PathLike[str], source: dict[str, Any],
               settings: ImportanceSettings | None = None, resume: bool = False,
               progress: Callable[[int, int], None] | None = None, *,
               engine: Callable[..., Sums] = accumulate) -> Importance:
    """Accumulate the gradients over the texts, then check them on the first `sample` texts; write OUTDIR.
    engine: what accumulates, `importance.accumulate` (here) or `distributed.accumulate` bound to its
    cluster options (on Ray workers, the same sums); the report's checks run here."""
    kind, settings = kind_of(m), settings or ImportanceSettings()
    sums: Sums = engine(m, texts, outdir, source, settings, resume, progress)
    raw = np.asarray(sums.total) / sums.documents
    norm = normalised(torch.from_numpy(raw)).numpy()
    sample = [t for _, t in zip(range(min(settings.sample, sums.documents)), iter(texts), strict=False)]
    ablation = one_head_ablation(m, kind, sample, settings)
    curve = pruning_curve(m, kind, sample, settings, norm)
    size = np.abs(ablation)  # |grad| estimates the size of the change, not its sign
    result = Importance(m.name, kind, sums.documents, sums.tokens, raw, norm, ablation, curve,
                        spearman(norm, size), spearman(raw, size),
                        "loss" if kind != "encoder" else "embedding_distance", len(sample))
    write(result, Path(outdir))
    return result


def write(r: Importance, out: Path) -> None:
    """importance.json, heads.csv, report.md and importance.html (the grids as heatmaps)."""
    from attnscope.views.effects import grids_html

    (out / "importance.json").write_text(json.dumps(r.to_dict()), encoding="utf-8")
    rows = ["layer,head,importance,normalised,ablation"]
    rows += [f"{la},{h},{r.raw[la, h]:.6g},{r.normalised[la, h]:.6g},{r.ablation[la, h]:.6g}"
             for la in range(r.raw.shape[0]) for h in range(r.raw.shape[1])]
    (out / "heads.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    (out / "report.md").write_text(report_markdown(r), encoding="utf-8")
    grids = {"normalised": r.normalised, "ablation": r.ablation}
    labels = {"normalised": "gradient importance, normalised per layer",
              "ablation": f"{r.measure} change with the head removed alone ({r.sample} documents)"}
    (out / "importance.html").write_text(grids_html(f"{r.model}: head importance", r.model, r.kind, grids, labels),
                                         encoding="utf-8")


UNITS = {"loss": "loss in nats per token", "embedding_distance": "cosine distance to the untouched embedding"}


def report_markdown(r: Importance) -> str:
    """report.md; `attnscope importance --format markdown` prints it."""
    return "\n".join(report_lines(r, md=True)) + "\n"


def report_lines(r: Importance, md: bool) -> list[str]:
    """The report as Markdown, or as plain text for the terminal: the same words, columns with units and signs."""
    top = sorted(((r.normalised[la, h], la, h) for la in range(r.raw.shape[0]) for h in range(r.raw.shape[1])),
                 reverse=True)[:10]
    unit = UNITS.get(r.measure, r.measure)
    grad = "E ||d embedding / d gate||" if r.kind == "encoder" else "E |d loss / d gate|"
    columns = ["layer.head", "normalised", "raw", "ablation"]
    rows = [[f"{la}.{h}", f"{v:.4f}", f"{r.raw[la, h]:.4g}", f"{r.ablation[la, h]:+.4g}"] for v, la, h in top]
    head = "# " if md else ""
    lines = [f"{head}Head importance: {r.model}", "",
             f"{r.documents:,} documents, {r.tokens:,} tokens; importance after Michel et al. 2019 ({grad}), "
             "normalised per layer. Layers and heads are 0-indexed.", "",
             f"Rank correlation (Spearman) with the size |change| of real one-head ablation on {r.sample} documents: "
             f"{r.spearman:.3f} (normalised), {r.spearman_raw:.3f} (raw).", "",
             f"{'## ' if md else ''}Most important heads", "",
             f"normalised: the raw importance divided by its layer's norm (0..1); raw: {grad}; ablation: the change "
             f"in {unit} with the head removed alone (+: worse without it).", ""]
    lines += _table(columns, rows, md)
    lines += ["", f"{'## ' if md else ''}Pruning curve ({unit}, heads removed least important first)", ""]
    lines += _table(["heads removed", r.measure], [[str(k), f"{v:.4f}"] for k, v in r.curve], md)
    return lines


def _table(columns: list[str], rows: list[list[str]], md: bool) -> list[str]:
    if md:
        return ["| " + " | ".join(columns) + " |", "|---" + "|---:" * (len(columns) - 1) + "|",
                *("| " + " | ".join(row) + " |" for row in rows)]
    widths = [max(len(c), *(len(row[i]) for row in rows)) for i, c in enumerate(columns)]
    return ["  ".join(c.rjust(w) for c, w in zip(cells, widths, strict=True)) for cells in [columns, *rows]]
