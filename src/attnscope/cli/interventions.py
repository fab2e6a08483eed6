"""ablate, patch, knockout and importance: which heads and edges matter for the model's output."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from attnscope.cli.common import (
    add_format,
    add_model_args,
    add_progress,
    add_text_args,
    integer,
    model_of,
    print_json,
    progress_bar,
    read_text,
)
from attnscope.errors import AttnscopeError, require_text

# torch, transformers and the interventions are imported when a command runs, so --help stays instant.
TOP = 8  # heads listed under a grid


def register(sub: Any) -> None:
    _register_ablate(sub)
    _register_patch(sub)
    _register_knockout(sub)
    _register_importance(sub)


def _register_ablate(sub: Any) -> None:
    p = sub.add_parser("ablate", help="remove heads (zero or mean) and measure the effect on the output")
    add_text_args(p, pair=False)
    p.add_argument("--heads", metavar="L.H[,L.H...]", help="heads to remove together, layer.head, 0-indexed; "
                   "an encoder-decoder's as kind:layer.head, kind encoder, decoder or cross (cross:1.2)")
    p.add_argument("--mode", choices=("zero", "mean"), default="zero",
                   help="zero the heads' context, or set it to its mean over --reference (default zero)")
    p.add_argument("--reference", metavar="PATH", help="--mode mean: texts to average over, one per line "
                   "(default: TEXT itself)")
    _add_target(p)
    p.add_argument("--each", action="store_true",
                   help="also remove every head alone (one batched forward): a layer x head grid")
    p.add_argument("--attention", choices=("encoder", "decoder", "cross"),
                   help="encoder-decoders with --each: the kind of attention whose heads the grid removes")
    p.add_argument("--html", metavar="FILE", help="--each: also write the grid as an HTML heatmap (FILE.html), "
                   "or as a figure (FILE.svg, FILE.png, FILE.pdf)")
    add_format(p)
    p.set_defaults(func=run_ablate)


def _register_patch(sub: Any) -> None:
    p = sub.add_parser("patch", help="activation patching: each head from the clean run into the corrupt run")
    p.add_argument("clean", metavar="CLEAN", help="the clean sentence")
    p.add_argument("corrupt", metavar="CORRUPT", help="the corrupted sentence, of the same token length")
    add_model_args(p)
    _add_target(p)
    p.add_argument("--contrast", metavar="TEXT", help="the corrupt answer token (default: the corrupt run's top token)")
    p.add_argument("--html", metavar="FILE", help="also write the grids as an HTML heatmap (FILE.html), or as a "
                   "figure (FILE.svg, FILE.png, FILE.pdf)")
    add_format(p)
    p.set_defaults(func=run_patch)


def _register_knockout(sub: Any) -> None:
    p = sub.add_parser("knockout", help="block attention edges from token I to token J and measure the effect")
    add_text_args(p, pair=False)
    p.add_argument("--from", dest="from_tokens", required=True, metavar="I[,I...]",
                   help="the tokens whose information is blocked (keys), 0-indexed")
    p.add_argument("--to", dest="to_tokens", required=True, metavar="J[,J...]",
                   help="the tokens that stop reading them (queries), 0-indexed")
    p.add_argument("--layers", metavar="L[,L...]", help="layers to block in, 0-indexed (default all)")
    _add_target(p)
    add_format(p)
    p.set_defaults(func=run_knockout)


def _register_importance(sub: Any) -> None:
    p = sub.add_parser("importance", help="head importance over a corpus (Michel et al. 2019), pruning curve, "
                       "and its rank correlation with one-head ablation")
    p.add_argument("source", metavar="SOURCE", help="a corpus as `attnscope stats` reads it (.txt, .jsonl, .csv, "
                   ".tsv, .parquet, .conllu, a directory of .txt)")
    p.add_argument("-o", "--output", required=True, metavar="OUTDIR", help="directory for the results")
    p.add_argument("--resume", action="store_true", help="continue the run checkpointed in OUTDIR")
    p.add_argument("--field", metavar="NAME", help="the text field of a .jsonl source (default: text)")
    p.add_argument("--column", metavar="NAME", help="the text column of a .csv/.tsv/.parquet source")
    add_model_args(p)
    p.add_argument("--batch-size", type=integer, default=8, metavar="N", help="documents per batch (default 8)")
    p.add_argument("--limit", type=integer, default=None, metavar="N", help="read only the first N documents")
    p.add_argument("--sample", type=integer, default=16, metavar="N",
                   help="documents for the pruning curve and the one-head ablations (default 16)")
    p.add_argument("--checkpoint-every", type=integer, default=10, metavar="N",
                   help="write a checkpoint every N batches (default 10)")
    p.add_argument("--engine", choices=("local", "ray"), default="local",
                   help="compute the gradients here, or on Ray workers (pip install 'attnscope[ray]'); same numbers")
    p.add_argument("--address", metavar="ADDR",
                   help="--engine ray: the cluster to join (auto, ray://HOST:10001); default: a local Ray runtime")
    p.add_argument("--workers", type=integer, metavar="N",
                   help="--engine ray: worker processes, each holding the model once (default: one per node)")
    add_progress(p)
    p.add_argument("--format", choices=("text", "markdown", "json"), default="text",
                   help="how to report the run (default text)")
    p.set_defaults(func=run_importance)


def _add_target(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", metavar="TEXT", help="the continuation whose log-probability is measured "
                   "(causal LMs; default the model's greedy next token), or the word at the mask (masked LMs), or "
                   "the target read teacher-forced (encoder-decoders: required)")


def numbers(value: str | None, flag: str) -> list[int] | None:
    """"1,2" -> [1, 2]; a one-line error naming the flag for anything else."""
    if value is None:
        return None
    try:
        return [int(s) for s in value.split(",") if s.strip()]
    except ValueError as exc:
        raise AttnscopeError(f"{flag} takes whole numbers separated by commas (0-indexed), got {value!r}") from exc


def run_ablate(args: argparse.Namespace) -> int:
    from attnscope.cli.common import read_text_file

    text = require_text(read_text(args))
    if args.heads is None and not args.each:
        raise AttnscopeError("give --heads L.H[,L.H...] (0-indexed), --each, or both")
    if args.html and not args.each:
        raise AttnscopeError("--html writes the --each grid: add --each")
    _html_kind(args.html)
    reference = None
    if args.reference is not None:
        if args.mode != "mean":
            raise AttnscopeError("--reference is read only with --mode mean")
        reference = [line for line in read_text_file(args.reference).splitlines() if line.strip()]
    from attnscope.interventions import ablate
    from attnscope.interventions.seq2seq import parse_kind_heads

    heads = parse_kind_heads(args.heads, "--heads") if args.heads is not None else []
    m = model_of(args)
    if args.html and m.model.config.is_encoder_decoder:
        raise AttnscopeError("--html is not drawn for an encoder-decoder yet: leave it out (the grid is printed)")
    result = ablate(text, heads, model=m, mode=args.mode, target=args.target, each=args.each,
                    reference=reference, max_length=args.max_length, attention=args.attention)
    if args.html:
        _write_html(args.html, result, m, text, args.max_length)
    _emit(result.to_dict(), args.format, _ablate_lines)
    return 0


def run_patch(args: argparse.Namespace) -> int:
    clean = require_text(args.clean, "clean text (CLEAN)")
    corrupt = require_text(args.corrupt, "corrupt text (CORRUPT)")
    from attnscope.interventions.patch import patch

    _html_kind(args.html)
    m = model_of(args)
    result = patch(clean, corrupt, model=m, target=args.target, contrast=args.contrast, max_length=args.max_length)
    if args.html:
        _write_html(args.html, result, m, clean, args.max_length)
    _emit(result.to_dict(), args.format, _patch_lines)
    return 0


def run_knockout(args: argparse.Namespace) -> int:
    text = require_text(read_text(args))
    sources, sinks = numbers(args.from_tokens, "--from"), numbers(args.to_tokens, "--to")
    layers = numbers(args.layers, "--layers")
    from attnscope.interventions.knockout import knockout

    result = knockout(text, sources or [], sinks or [], layers, model=model_of(args), target=args.target,
                      max_length=args.max_length)
    _emit(result.to_dict(), args.format, _knockout_lines)
    return 0


def _html_kind(path: str | None) -> str | None:
    """html, or svg, png, pdf for a figure of the grid: checked before anything runs."""
    from pathlib import Path

    if path is None:
        return None
    kind = {".html": "html", ".htm": "html", "": "html"}.get(Path(path).suffix.lower(), Path(path).suffix[1:].lower())
    if kind not in ("html", "svg", "png", "pdf"):
        raise AttnscopeError(f"unsupported --html format {kind!r}: name it FILE.html (the heatmap page), or FILE.svg, "
                             "FILE.png or FILE.pdf (a figure)")
    return kind


def _write_html(path: str, result: Any, m: Any, text: str, max_length: int) -> None:
    """The grid's heatmap, with the text's trace for the head and neuron views a click opens; or its figure."""
    from pathlib import Path

    from attnscope.tracing.one_pass import trace
    from attnscope.views.effects import effects_figure, effects_html

    out = Path(path)
    if _html_kind(path) != "html":
        effects_figure(result, out)
        sys.stderr.write(f"wrote {out} ({out.stat().st_size / 1e3:.0f} kB)\n")
        return
    out.write_text(effects_html(result, trace(text, model=m, max_length=max_length)), encoding="utf-8")
    sys.stderr.write(f"wrote {out} ({out.stat().st_size / 1e3:.0f} kB)\n")


def _emit(payload: dict[str, Any], fmt: str, lines: Any) -> None:
    if fmt == "json":
        print_json(payload)
        return
    sys.stdout.write("\n".join(lines(payload, fmt == "markdown")) + "\n")  # plain text: no wrapping


def _measures(values: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:+.4f}" if k.startswith("d_") else f"{k} {v:.4f}" for k, v in values.items())


def _ablate_lines(d: dict[str, Any], md: bool) -> list[str]:
    heads = ",".join(":".join(map(str, h[:-2])) + ":" * (len(h) > 2) + f"{h[-2]}.{h[-1]}" for h in d["heads"])
    layout = "kind:layer.head" if d["kind"] == "seq2seq-lm" else "layer.head"
    what = f"heads {heads} ({layout}, 0-indexed)" if heads else "each head alone"
    out = [f"{'# ' if md else ''}{d['model']} ({d['kind']}): {d['mode']} ablation, {what}", ""]
    if d["target"] is not None:
        out.append(f"target {d['target']!r}; untouched: {_measures(d['clean'])}")
    if d["ablated"] is not None:
        out.append(f"ablated: {_measures(d['ablated'])}")
    if d["token_change"] is not None:
        out.append("each token's final-state change: " + ", ".join(
            f"{t} {c:.3f}" for t, c in zip(d["tokens"], d["token_change"], strict=True)))
    if d["grid"] is not None:
        kind = f"each {d['attention']} head" if d.get("attention") else "each head"
        out += ["", *grid_lines(d["grid"][d["primary"]], f"{d['primary']}, {kind} removed alone", md)]
    return out


def _patch_lines(d: dict[str, Any], md: bool) -> list[str]:
    what = (f"logit difference {d['answer']!r} - {d['contrast']!r}" if d["answer"] is not None
            else "pooled embedding's cosine similarity to the clean run")
    out = [f"{'# ' if md else ''}{d['model']} ({d['kind']}): activation patching, {what}", "",
           f"clean {d['clean']:.4f}, corrupt {d['corrupt']:.4f}",
           "patched: one head's context (its attention output before W_O, at every position) from one run into "
           "the other, every other head untouched",
           "recovered = (m(corrupt run, clean head) - m(corrupt)) / (m(clean) - m(corrupt)): 1 restores the clean "
           "answer, 0 changes nothing", ""]
    out += grid_lines(d["denoised"], "recovered: each clean head patched into the corrupt run", md)
    out += ["", "lost = (m(clean) - m(clean run, corrupt head)) / (m(clean) - m(corrupt)): 1 loses all of it", ""]
    out += grid_lines(d["noised"], "lost: each corrupt head patched into the clean run", md)
    return out


def _knockout_lines(d: dict[str, Any], md: bool) -> list[str]:
    edges = ", ".join(f"{i} {d['tokens'][i]!r} -> {j} {d['tokens'][j]!r}" for i, j in d["edges"])
    out = [f"{'# ' if md else ''}{d['model']} ({d['kind']}): knockout of {edges} (tokens 0-indexed)", "",
           f"layers {','.join(map(str, d['layers']))}: {_measures(d['knocked'])}"]
    if d["target"] is not None:
        out.insert(2, f"target {d['target']!r}; untouched: {_measures(d['clean'])}")
    values = d["per_layer"][d["primary"]]
    out += ["", f"{d['primary']} with each layer alone:"]
    out += [f"  layer {la}: {v:+.4f}" for la, v in zip(d["layers"], values, strict=True)]
    return out


def grid_lines(grid: list[list[float]], title: str, md: bool) -> list[str]:
    """A layer x head table (0-indexed) and the heads with the largest |value|."""
    n_heads = len(grid[0])
    lines = [f"{title} (rows: layers, columns: heads, 0-indexed)", ""]
    cells = [[f"{v:+.4f}" for v in row] for row in grid]
    if md:
        lines += ["| layer | " + " | ".join(map(str, range(n_heads))) + " |", "|---:" * (n_heads + 1) + "|"]
        lines += [f"| {la} | " + " | ".join(row) + " |" for la, row in enumerate(cells)]
    else:
        lines.append("layer " + " ".join(f"{h:>7}" for h in range(n_heads)))
        lines += [f"{la:>5} " + " ".join(f"{c:>7}" for c in row) for la, row in enumerate(cells)]
    ranked = sorted(((abs(v), la, h, v) for la, row in enumerate(grid) for h, v in enumerate(row)), reverse=True)
    lines += ["", "largest: " + ", ".join(f"{la}.{h} {v:+.4f}" for _, la, h, v in ranked[:TOP])]
    return lines


class _Texts:
    """A stats Source read as plain texts, again and again in the same order."""

    def __init__(self, source: Any) -> None:
        self.source = source

    def __iter__(self) -> Any:
        return (doc.text for doc in self.source)


def _importance_engine(args: argparse.Namespace) -> Any:
    """importance.accumulate, or the Ray engine's bound to the cluster options (a missing Ray is reported
    here, before the model loads)."""
    from attnscope.interventions.importance import accumulate

    if args.engine != "ray":
        if args.address is not None or args.workers is not None:
            raise AttnscopeError("--address and --workers choose where a Ray run goes: add --engine ray")
        return accumulate
    import functools

    from attnscope.interventions import distributed
    from attnscope.stats.distributed import require_ray

    require_ray("--engine ray")
    return functools.partial(distributed.accumulate, address=args.address, workers=args.workers)


def run_importance(args: argparse.Namespace) -> int:
    for flag, value in (("--batch-size", args.batch_size), ("--sample", args.sample),
                        ("--checkpoint-every", args.checkpoint_every), ("--limit", args.limit),
                        ("--workers", args.workers)):
        if value is not None and value < 1:  # None: not given (--limit, --workers)
            raise AttnscopeError(f"{flag} must be at least 1, got {value}")
    engine = _importance_engine(args)
    import time

    from attnscope.interventions.importance import ImportanceSettings
    from attnscope.interventions.importance_report import importance
    from attnscope.stats.engine import Progress
    from attnscope.stats.sources import Source

    source = Source(args.source, field=args.field, column=args.column)
    m = model_of(args)  # first: --max-length's default fits the model
    settings = ImportanceSettings(args.batch_size, args.max_length, args.limit, args.checkpoint_every, args.sample)
    bar = progress_bar(args, source, args.limit)
    started = time.monotonic()

    def progress(documents: int, tokens: int) -> None:
        if bar is not None:
            bar.update(Progress(documents, tokens, time.monotonic() - started, bar.total))

    try:
        try:
            r = importance(m, _Texts(source), args.output, source.describe(), settings, args.resume, progress,
                           engine=engine)
        finally:
            if bar is not None:
                bar.close()
    except KeyboardInterrupt:
        print(f"attnscope: interrupted; the checkpoint in {args.output} keeps the finished batches: "
              "add --resume to the same command to continue", file=sys.stderr)
        return 130
    if args.format == "json":
        print_json({"output": args.output, **r.to_dict()})
        return 0
    from pathlib import Path

    from attnscope.interventions.importance_report import report_lines

    sys.stdout.write("\n".join(report_lines(r, md=args.format == "markdown")) + "\n")
    out = Path(args.output).resolve()
    print("\nFiles: " + ", ".join(str(out / f) for f in ("importance.json", "heads.csv", "report.md",
                                                         "importance.html")))
    return 0
