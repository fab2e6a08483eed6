"""attnscope qkmap, attnscope heads and attnscope heads-compare: the corpus explorer's query/key maps and heads grouped
by what they do (issue 33), a thin layer over attnscope.corpus and attnscope.views."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnscope.cli.common import (
    add_engine_args,
    add_model_args,
    add_progress,
    add_source_args,
    engine_of,
    integer,
    model_of,
    print_json,
    progress_bar,
    real,
    source_of,
)
from attnscope.cli.corpus import numbers
from attnscope.errors import AttnscopeError

if TYPE_CHECKING:
    from attnscope.corpus.head_groups import Comparison, HeadGroups

# torch, transformers and the passes are imported when a command runs, so --help stays instant.
PAGE = "heads.html"
FIGURES = (".svg", ".png", ".pdf")


def register(sub: Any) -> None:
    _register_qkmap(sub)
    _register_heads(sub)
    _register_compare(sub)


def _register_qkmap(sub: Any) -> None:
    from attnscope.views.qkmap import COLOURS

    p = sub.add_parser("qkmap", help="a head's queries and keys from a corpus index in one 2-D map (AttentionViz)")
    p.add_argument("index", metavar="INDEX", help="a directory made by attnscope index")
    p.add_argument("--layer", type=integer, required=True, metavar="L",
                   help="the layer (0-indexed; one the index keeps)")
    p.add_argument("--head", type=numbers, default=None, metavar="H,...",
                   help="the heads, 0-indexed: 3, or 0,3 or 0-5 (default: every head the index keeps, as small "
                        "multiples)")
    p.add_argument("-o", "--output", required=True, metavar="FILE",
                   help="FILE.html (the interactive page), or a figure: FILE.svg, FILE.png or FILE.pdf")
    p.add_argument("--colour-by", choices=COLOURS, default="kind",
                   help="what a point's colour says: query or key (kind), token position, UD part of speech (upos) "
                        "or UD relation (deprel) (default kind; the page has a toggle)")
    p.add_argument("--projection", choices=("pca", "tsne", "umap"), default="pca",
                   help="pca (default), tsne (needs scikit-learn: the stats extra) or umap (needs umap-learn)")
    p.add_argument("--limit", type=integer, default=500, metavar="N",
                   help="tokens sampled from the index, the same for every head (default 500; 0: every token)")
    p.add_argument("--seed", type=integer, default=0, metavar="S", help="the sample's and projection's seed")
    p.add_argument("--scale", type=real, default=2.0, metavar="X", help="PNG pixels per SVG pixel (default 2)")
    p.add_argument("--no-caption", action="store_true", help="a figure without its caption lines")
    p.set_defaults(func=run_qkmap)


def _register_heads(sub: Any) -> None:
    p = sub.add_parser("heads", help="group a model's heads by what they do over a corpus (Jensen-Shannon distance, "
                                     "dendrogram, map, behaviour labels)")
    add_source_args(p)
    p.add_argument("-o", "--output", required=True, metavar="OUT",
                   help="directory for heads.npz (the sums, also the checkpoint) and heads.html")
    p.add_argument("--resume", action="store_true", help="continue the pass checkpointed in OUT")
    add_progress(p)
    add_model_args(p)
    p.add_argument("--batch-size", type=integer, default=8, metavar="N", help="documents per batch (default 8)")
    p.add_argument("--limit", type=integer, default=None, metavar="N", help="read only the first N documents")
    p.add_argument("--checkpoint-every", type=integer, default=20, metavar="N",
                   help="write a checkpoint every N batches (default 20)")
    add_engine_args(p)
    _grouping_args(p)
    p.add_argument("--example", metavar="TEXT", default=None,
                   help="the sentence whose attention a click on a head opens in the page (default: the corpus' "
                        "first document)")
    p.set_defaults(func=run_heads)


def _register_compare(sub: Any) -> None:
    p = sub.add_parser("heads-compare", help="two models' heads side by side by behaviour (two attnscope heads runs)")
    p.add_argument("first", metavar="OUT_A", help="a directory (or heads.npz) of attnscope heads")
    p.add_argument("second", metavar="OUT_B", help="another model's")
    p.add_argument("-o", "--output", metavar="FILE", default=None, help="also write the page (FILE.html)")
    p.add_argument("--clusters", type=integer, default=None, metavar="K", help="clusters of the first model's page")
    p.add_argument("--format", choices=("text", "json"), default="text", help="output format (default text)")
    p.set_defaults(func=run_compare)


def _grouping_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--clusters", type=integer, default=None, metavar="K",
                   help="cut the dendrogram into K groups (default: about the square root of the heads)")
    p.add_argument("--compare", metavar="OTHER", default=None,
                   help="another model's attnscope heads directory: compare the heads by behaviour")
    p.add_argument("--figure", metavar="FILE", default=None,
                   help="also write the dendrogram and map as FILE.svg, FILE.png or FILE.pdf")
    p.add_argument("--format", choices=("text", "json"), default="text", help="output format (default text)")


def run_qkmap(args: argparse.Namespace) -> int:
    from attnscope.corpus.store import CorpusIndex

    out = Path(args.output)
    suffix = out.suffix.lower()
    if suffix not in (".html", *FIGURES):
        raise AttnscopeError(f"-o {out}: name the output FILE.html, FILE.svg, FILE.png or FILE.pdf")
    if args.limit < 0:
        raise AttnscopeError(f"--limit {args.limit} must be 0 (every token) or more")
    index = CorpusIndex(args.index)
    options = {"limit": args.limit or None, "seed": args.seed, "method": args.projection, "colour": args.colour_by}
    try:
        if suffix == ".html":
            from attnscope.views.qkmap import qkmap_page

            qkmap_page(index, args.layer, args.head, **options).save(out)
        else:
            from attnscope.views.qkmap import qkmap_figure

            qkmap_figure(index, args.layer, out, args.head, scale=args.scale, caption=not args.no_caption, **options)
    except AttnscopeError as exc:
        raise AttnscopeError(_as_flags(str(exc)), parameter=exc.parameter) from exc
    print(f"Query/key maps: {out}")
    return 0


def _as_flags(message: str) -> str:
    return (message.replace("head=", "--head ").replace("layer=", "--layer ").replace("colour_by", "--colour-by")
            .replace("use pca", "use --projection pca").replace("resume=True", "--resume"))


def run_heads(args: argparse.Namespace) -> int:
    from attnscope.corpus.head_groups import groups, read_groups
    from attnscope.corpus.heads import head_pass
    from attnscope.corpus.tags import TaggedSource
    from attnscope.stats.settings import Settings

    source = source_of(args, TaggedSource)
    other = read_groups(args.compare) if args.compare else None  # a bad --compare is refused before the pass
    engine = engine_of(args)  # before the model loads
    model = model_of(args)
    max_length = args.max_length or min(128, model.max_positions)
    settings = Settings(max_length=max_length, batch_size=args.batch_size, truncate=not args.no_truncate,
                        limit=args.limit, checkpoint_every=max(1, args.checkpoint_every))
    try:
        bar = progress_bar(args, source, settings.limit)  # counting reads the source: its errors in flag words too
        try:
            run = head_pass(source, args.output, model, settings=settings, resume=args.resume, engine=engine,
                            progress=bar.update if bar else None)
        finally:
            if bar:
                bar.close()
    except KeyboardInterrupt:
        print(f"attnscope: interrupted; add --resume to the same command to continue the pass in {args.output}",
              file=sys.stderr)
        return 130
    except AttnscopeError as exc:
        raise AttnscopeError(_as_flags(str(exc)), parameter=exc.parameter) from exc
    g = groups(run.sums, run.syntax, run.model, run.causal, args.clusters)
    example = args.example if args.example is not None else _first_text(args)
    from attnscope.tracing.one_pass import trace

    shown = trace(example, model=model, max_length=max_length) if example else None
    comparison = _compare(g, other)
    page = _write(g, Path(args.output) / PAGE, shown, comparison, args.figure)
    if args.format == "json":
        print_json({"heads": g.to_dict(), "comparison": None if comparison is None else comparison.to_dict(),
                    "page": str(page), "seconds": round(run.seconds, 3), "resumed_from_documents": run.resumed_from})
        return 0
    resumed = f" ({run.resumed_from:,} before resuming)" if run.resumed_from else ""
    print(f"{g.layers * g.heads} heads of {g.model} over {g.documents:,} documents ({g.tokens:,} tokens) in "
          f"{run.seconds:.1f} s{resumed}")
    _print_groups(g, comparison)
    print(f"Page: {page}")
    return 0


def _first_text(args: argparse.Namespace) -> str | None:
    """The corpus' first document's text (a fresh reader: the pass's counts stay its own)."""
    from attnscope.stats.sources import Source

    source = Source(args.source, field=args.field, column=args.column)
    source.quiet = True
    for doc in source:
        return doc.text
    return None


def _compare(g: HeadGroups, other: HeadGroups | None) -> Comparison | None:
    from attnscope.corpus.head_groups import compare

    return None if other is None else compare(g, other)


def _write(g: HeadGroups, page: Path, trace: Any, comparison: Comparison | None, figure: str | None) -> Path:
    from attnscope.views.heads import heads_figure, heads_page

    heads_page(g, trace, comparison).save(page)
    if figure:
        heads_figure(g, figure)
        print(f"Figure: {figure}")
    return page


def _print_groups(g: HeadGroups, comparison: Comparison | None) -> None:
    """Label counts, the heads of each label, the clusters; then the comparison."""
    print("labels: " + ", ".join(f"{k} {v}" for k, v in g.label_counts().items()))
    by_label: dict[str, list[str]] = {}
    for name, labels in zip(g.names, g.labels, strict=True):
        for lab in labels:
            by_label.setdefault(lab, []).append(name)
    for lab, names in sorted(by_label.items()):
        print(f"  {lab}: {' '.join(names)}")
    print(f"clusters (layer.head, 0-indexed; {int(g.clusters.max())} groups):")
    for c in range(1, int(g.clusters.max()) + 1):
        print(f"  {c}: {' '.join(n for n, k in zip(g.names, g.clusters, strict=True) if k == c)}")
    if comparison is not None:
        print_comparison(comparison)


def print_comparison(c: Comparison) -> None:
    print(f"{c.a} vs {c.b} (heads per label):")
    for label, (a, b) in c.counts.items():
        print(f"  {label:<14} {a:>4} {b:>4}")
    print(f"nearest {c.b} head of each {c.a} head by behaviour ({', '.join(c.columns)}):")
    for r in sorted(c.nearest, key=lambda r: r["distance"]):
        print(f"  {r['head']:>6} -> {r['other']:<6} {r['distance']:.3f}  {', '.join(r['labels']) or 'mixed'} / "
              f"{', '.join(r['other_labels']) or 'mixed'}")


def run_compare(args: argparse.Namespace) -> int:
    from attnscope.corpus.head_groups import compare, read_groups

    a, b = read_groups(args.first, args.clusters), read_groups(args.second)
    c = compare(a, b)
    if args.output:
        from attnscope.views.heads import heads_page

        heads_page(a, None, c).save(args.output)
    if args.format == "json":
        print_json(c.to_dict())
    else:
        print_comparison(c)
        if args.output:
            print(f"Page: {args.output}")
    return 0
