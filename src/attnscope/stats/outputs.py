"""Write a run's results: heads.parquet/.csv, syntax.parquet, summary.json, heatmaps, report.html."""

from __future__ import annotations

import csv
import io
import json
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from attnscope.families import family_of
from attnscope.models import Model, describe
from attnscope.stats.metric_sets import descriptions
from attnscope.stats.metrics import BROAD_RATIO, CLASS_RULES, head_classes
from attnscope.stats.settings import Settings
from attnscope.stats.state import StatsState
from attnscope.stats.syntax import DIRECTIONS, OFFSETS, best_heads


def head_rows(state: StatsState) -> list[dict[str, Any]]:
    """One row per layer x head (0-indexed): each metric's mean, std and count, and the head's classes."""
    stats = {name: (state.mean(name), state.std(name), state.count[name]) for name in state.metrics}
    classes = head_classes({name: mean for name, (mean, _, _) in stats.items()})
    rows = []
    for layer in range(state.layers):
        for head in range(state.heads):
            row: dict[str, Any] = {"layer": layer, "head": head}
            for name, (mean, std, count) in stats.items():
                row[f"{name}_mean"] = float(mean[layer, head])
                row[f"{name}_std"] = float(std[layer, head])
                row[f"{name}_count"] = int(count[layer, head])
            row["classes"] = " ".join(classes[layer][head])
            rows.append(row)
    return rows


def syntax_rows(state: StatsState) -> list[dict[str, Any]]:
    """One row per relation x direction x layer x head, with the relation's best fixed offset."""
    if state.syntax is None:
        return []
    rows = []
    for relation, (total, correct, offsets) in sorted(state.syntax.with_all().items()):
        k = int(np.argmax(offsets))
        for d, direction in enumerate(DIRECTIONS):
            for layer in range(state.layers):
                for head in range(state.heads):
                    hits = int(correct[d, layer, head])
                    rows.append({
                        "relation": relation, "direction": direction, "layer": layer, "head": head,
                        "correct": hits, "total": int(total), "accuracy": hits / total if total else float("nan"),
                        "baseline_offset": OFFSETS[k],
                        "baseline_accuracy": float(offsets[k]) / total if total else float("nan"),
                    })
    return rows


def write_table(rows: list[dict[str, Any]], parquet: Path, csv_path: Path | None = None) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns = list(rows[0]) if rows else []
    table = pa.Table.from_pydict({c: [r[c] for r in rows] for c in columns})
    pq.write_table(table, parquet)
    if csv_path is not None:
        with csv_path.open("w", encoding="utf-8", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=columns)
            writer.writeheader()
            writer.writerows({k: repr(v) if isinstance(v, float) else v for k, v in r.items()} for r in rows)


def summary(state: StatsState, model: Model, source: dict[str, Any], run: dict[str, Any],
            settings: Settings | None = None) -> dict[str, Any]:
    """Everything about a run in one JSON-able dict (written as summary.json); settings name the
    metric sets whose descriptions it gives (the built-in and named sets are always known)."""
    described = descriptions(settings.metric_sets if settings is not None else ())
    info = describe(model)
    fam = family_of(model.model)
    info.update(family=fam.name if fam else None, causal=bool(state.settings.get("causal")))
    rows = head_rows(state)
    return {
        "model": info,
        "source": source,
        "documents": state.documents,
        "tokens": state.tokens,
        "truncated": state.truncated,
        "settings": run.get("settings", {}),
        "run": {k: v for k, v in run.items() if k != "settings"},
        "versions": versions(),
        "metrics": {name: described.get(name, name) for name in state.metrics},
        "thresholds": {"broad": f"entropy > {BROAD_RATIO} x entropy_uniform",
                       **{name: f"{metric} > {t}" for name, metric, t in CLASS_RULES}},
        "head_classes": [{"layer": r["layer"], "head": r["head"], "classes": r["classes"].split()}
                         for r in rows if r["classes"]],
        "syntax": None if state.syntax is None else {
            "best_heads": best_heads(state.syntax), "unscored_words": state.syntax.unscored},
        "indexing": "layers and heads are 0-indexed",
    }


def versions() -> dict[str, str]:
    import tokenizers
    import torch
    import transformers

    import attnscope

    return {"attnscope": attnscope.__version__, "torch": torch.__version__,
            "transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
            "numpy": np.__version__, "python": platform.python_version()}


def heatmap_png(values: np.ndarray, title: str) -> bytes:
    """A layer x head heatmap (0-indexed axes) as PNG bytes, drawn without touching pyplot's state."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    layers, heads = values.shape
    fig = Figure(figsize=(max(4.0, 0.45 * heads + 2), max(3.0, 0.4 * layers + 1.5)), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    image = ax.imshow(values, cmap="viridis", aspect="auto")
    fig.colorbar(image, ax=ax)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("head (0-indexed)")
    ax.set_ylabel("layer (0-indexed)")
    ax.set_xticks(range(heads))
    ax.set_yticks(range(layers))
    if layers * heads <= 256:
        finite = values[np.isfinite(values)]
        middle = float(finite.mean()) if finite.size else 0.0
        for (i, j), v in np.ndenumerate(values):
            ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=6,
                    color="black" if v > middle else "white")
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return buffer.getvalue()


@dataclass
class Written:
    paths: list[Path]  # every file written
    info: dict[str, Any]  # summary.json
    heads: list[dict[str, Any]]  # heads.parquet's rows


def write_outputs(state: StatsState, model: Model, outdir: str | Path, source: dict[str, Any],
                  run: dict[str, Any], settings: Settings | None = None) -> Written:
    """Write every output file into outdir; returns their paths and the summary."""
    from attnscope.stats.report_page import report_html

    out = Path(outdir)
    written = [out / "heads.parquet", out / "heads.csv"]
    heads = head_rows(state)
    write_table(heads, written[0], written[1])
    if state.syntax is not None:
        written.append(out / "syntax.parquet")
        write_table(syntax_rows(state), written[-1])
    plots = out / "plots"
    plots.mkdir(exist_ok=True)
    images: dict[str, bytes] = {}
    described = descriptions(settings.metric_sets if settings is not None else ())
    for name in state.metrics:
        title = f"{described.get(name, name)}: mean over documents"
        images[name] = heatmap_png(state.mean(name), title)
        (plots / f"{name}.png").write_bytes(images[name])
        written.append(plots / f"{name}.png")
    info = summary(state, model, source, run, settings)
    written.append(out / "summary.json")
    info["outputs"] = [str(p.relative_to(out)) for p in [*written, out / "report.html"]]
    written[-1].write_text(json.dumps(info, indent=2, allow_nan=True) + "\n", encoding="utf-8")
    written.append(out / "report.html")
    written[-1].write_text(report_html(info, heads, images), encoding="utf-8")
    return Written(written, info, heads)
