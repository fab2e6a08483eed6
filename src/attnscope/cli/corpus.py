"""attnscope index and attnscope search: the corpus explorer (issue 33), a thin layer over attnscope.corpus."""

from __future__ import annotations

import argparse
import re
import sys
from typing import TYPE_CHECKING, Any

from attnscope.cli.common import (
    SOURCE_HELP,
    add_engine_args,
    add_model_args,
    add_progress,
    add_source_args,
    console,
    engine_of,
    integer,
    model_of,
    print_json,
    progress_bar,
    source_of,
)
from attnscope.errors import AttnscopeError

if TYPE_CHECKING:
    from rich.text import Text

    from attnscope.corpus.search import Match, SearchResult
    from attnscope.corpus.summary import MatchSummary

# torch, transformers and the index build are imported when a command runs, so --help stays instant.

CONTEXT_CHARS = 48  # characters shown on each side of a match
BAR = 24  # characters of the longest summary bar


def register(sub: Any) -> None:
    _register_index(sub)
    _register_search(sub)


def _register_index(sub: Any) -> None:
    p = sub.add_parser("index", help="index a corpus by what the model computes (vectors and attention per token)")
    add_source_args(p, SOURCE_HELP + " (CoNLL-U adds UD part of speech and dependency relations)")
    p.add_argument("-o", "--output", required=True, metavar="INDEX", help="directory for the index")
    p.add_argument("--resume", action="store_true", help="continue the build checkpointed in INDEX")
    add_progress(p)
    p.add_argument("--layers", type=numbers, default=None, metavar="L,...",
                   help="layers to keep, 0-indexed: 0,3,5 or 2-4 (default: all)")
    p.add_argument("--heads", type=numbers, default=None, metavar="H,...",
                   help="heads whose q, k and attention summary to keep, 0-indexed (default: all)")
    p.add_argument("--ann", type=ann_kinds, default=None, metavar="KINDS",
                   help="vectors that get an approximate index: embedding,context (default), embedding, or none; "
                        "needs pip install 'attnscope[corpus]' (without it, searches are exact)")
    add_model_args(p, placement=True)
    p.add_argument("--batch-size", type=integer, default=32, metavar="N", help="documents per batch (default 32)")
    p.add_argument("--limit", type=integer, default=None, metavar="N", help="read only the first N documents")
    p.add_argument("--checkpoint-every", type=integer, default=20, metavar="N",
                   help="write a checkpoint every N batches (default 20)")
    p.add_argument("--format", choices=("text", "json"), default="text", help="how to report the build")
    add_engine_args(p)
    p.set_defaults(func=run_index)


def _register_search(sub: Any) -> None:
    from attnscope.corpus.store import BY

    p = sub.add_parser("search", help="the corpus tokens nearest to a token of a text, with a summary (exBERT)")
    p.add_argument("index", metavar="INDEX", help="a directory made by attnscope index")
    p.add_argument("text", metavar="TEXT", help="the sentence holding the query token")
    p.add_argument("--token", type=integer, required=True, metavar="I",
                   help="the query token's index in TEXT (0-indexed, special tokens included: `attnscope tokens`)")
    p.add_argument("--layer", type=integer, required=True, metavar="L", help="the layer to compare at (0-indexed)")
    p.add_argument("--by", choices=BY, default="embedding",
                   help="what to compare: the layer's output embedding, its attention context (all heads), or one "
                        "head's query or key vector (with --head) (default embedding)")
    p.add_argument("--head", type=integer, default=None, metavar="H", help="the head for --by query or key")
    p.add_argument("-k", type=integer, default=50, metavar="K", help="how many matches (default 50)")
    p.add_argument("--exact", action="store_true",
                   help="compare with every token (the reference) instead of the approximate index")
    p.add_argument("--no-verify", action="store_true",
                   help="skip the sha256 check of the files read (faster on a large index you trust)")
    p.add_argument("--model", metavar="M", default=None,
                   help="the model (default: the one the index was built with; another one is refused)")
    p.add_argument("--format", choices=("text", "json"), default="text", help="output format (default text)")
    p.set_defaults(func=run_search)


def numbers(text: str) -> list[int]:
    """argparse type: 0-indexed numbers as 0,3,5 and ranges as 2-4."""
    out: list[int] = []
    for part in text.split(","):
        match = re.fullmatch(r"\s*([0-9]+)\s*(?:-\s*([0-9]+)\s*)?", part)
        if match is None:
            raise argparse.ArgumentTypeError(f"{text!r} is not a list of numbers: write 0,3,5 or 2-4")
        low, high = int(match.group(1)), int(match.group(2) or match.group(1))
        if high < low:
            raise argparse.ArgumentTypeError(f"the range {part.strip()} runs backwards: write {high}-{low}")
        out += range(low, high + 1)
    return out


def ann_kinds(text: str) -> tuple[str, ...]:
    """argparse type: which vectors get an approximate index ("none" for none)."""
    from attnscope.corpus.ann import KINDS

    if text.strip() == "none":
        return ()
    kinds = tuple(k.strip() for k in text.split(","))
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        raise argparse.ArgumentTypeError(f"{', '.join(bad)}: choose from {', '.join(KINDS)}, or none")
    return kinds


def run_index(args: argparse.Namespace) -> int:
    from attnscope.corpus.ann import KINDS, library
    from attnscope.corpus.index import build_index
    from attnscope.corpus.tags import TaggedSource
    from attnscope.stats.settings import Settings

    source = source_of(args, TaggedSource)
    engine = engine_of(args)  # before the model loads
    model = model_of(args)
    settings = Settings(max_length=args.max_length, batch_size=args.batch_size, truncate=not args.no_truncate,
                        limit=args.limit, checkpoint_every=max(1, args.checkpoint_every))
    kinds = KINDS if args.ann is None else args.ann
    try:
        bar = progress_bar(args, source, settings.limit)  # counting reads the source: its errors in flag words too
        try:
            result = build_index(source, args.output, model, layers=args.layers, heads=args.heads,
                                 settings=settings, resume=args.resume, ann=kinds, engine=engine,
                                 progress=bar.update if bar else None)
        finally:
            if bar:
                bar.close()  # before any message, so it is not printed on the bar's line
    except KeyboardInterrupt:
        print(f"attnscope: interrupted; add --resume to the same command to continue the build in {args.output}",
              file=sys.stderr)
        return 130
    except AttnscopeError as exc:
        raise AttnscopeError(_as_flags(str(exc)), parameter=exc.parameter) from exc
    if args.format == "json":
        print_json({"index": str(result.path), "documents": result.documents, "tokens": result.tokens,
                    "truncated": result.truncated, "malformed": result.malformed, "ann": result.ann,
                    "seconds": round(result.seconds, 3), "resumed_from_documents": result.resumed_from})
        return 0
    resumed = f" ({result.resumed_from:,} before resuming)" if result.resumed_from else ""
    print(f"{result.documents:,} documents, {result.tokens:,} tokens ({result.truncated:,} truncated, "
          f"{result.malformed:,} malformed rows skipped) in {result.seconds:.1f} s{resumed}")
    if result.ann is None and kinds and library() is None:
        print("no approximate index (FAISS is not installed: pip install 'attnscope[corpus]'); searches are exact")
    print(f"Index: {result.path}")
    return 0


def _as_flags(message: str) -> str:
    """The library's parameter names that are not this command's own in its flags."""
    for pattern, flag in ((r"\bresume=True\b", "--resume"), (r"\bstrict=True\b", "--strict"),
                          (r"\bset truncate=True\b", "drop --no-truncate"), (r"\btruncate=False\b", "--no-truncate")):
        message = re.sub(pattern, flag, message)
    return message


def run_search(args: argparse.Namespace) -> int:
    from attnscope.corpus.query import search

    try:
        result = search(args.index, args.text, token=args.token, layer=args.layer, by=args.by, head=args.head,
                        k=args.k, model=args.model, exact=args.exact, verify=not args.no_verify)
    except AttnscopeError as exc:  # main turns the parameter it names into its flag; the others here
        message = re.sub(r"\bmodel=(\S+)", r"--model \1", str(exc)).replace("exact=True", "--exact")
        raise AttnscopeError(re.sub(r"\bby='(\w+)'", r"--by \1", message), parameter=exc.parameter) from exc
    if args.format == "json":
        print_json(result.to_dict())
        return 0
    out = console()
    for line in search_lines(result):
        out.print(line, soft_wrap=True)  # one match, one line, however wide
    return 0


def search_lines(result: SearchResult) -> list[Text | str]:
    """The text report: the query, each match in its sentence with the token highlighted, then the summary."""
    from rich.text import Text

    head = f", head {result.head}" if result.head is not None else ""
    lines: list[Text | str] = [Text(
        f"{len(result.matches)} tokens nearest to token {result.token} {result.token_text!r} of {result.text!r} "
        f"by {result.by} at layer {result.layer}{head} (0-indexed; cosine distance; {result.method})")]
    width = len(str(len(result.matches) - 1))
    for m in result.matches:
        line = Text(f"{m.rank:>{width}}  {m.distance:.4f}  ")
        line.append_text(in_context(m))
        labels = " ".join(x for x in (m.upos, m.deprel) if x)
        line.append(f"  [{m.where}, position {m.position}{', ' + labels if labels else ''}]", style="dim")
        lines.append(line)
    lines += summary_lines(result.summary)
    return lines


def in_context(m: Match) -> Text:
    """The match's sentence around it, the token marked [[like this]] (and bold on a terminal)."""
    from rich.text import Text

    start = m.start + len(m.token) - len(m.token.lstrip())  # a byte-level BPE piece's leading space stays outside
    left, right = m.text[max(0, start - CONTEXT_CHARS):start], m.text[m.end:m.end + CONTEXT_CHARS]
    text = Text(("..." if start > CONTEXT_CHARS else "") + left.replace("\n", " "))
    text.append(f"[[{m.token.strip() or '(special)'}]]", style="bold reverse")
    text.append(right.replace("\n", " ") + ("..." if m.end + CONTEXT_CHARS < len(m.text) else ""))
    return text


def summary_lines(summary: MatchSummary) -> list[Text | str]:
    """The exBERT-style summary: a bar per UPOS, DEPREL and position bin."""
    from rich.text import Text

    lines: list[Text | str] = [Text(f"Summary of the {summary.total} matches (counts):", style="bold")]
    for title, counts in (("UD part of speech", summary.upos), ("UD dependency relation", summary.deprel),
                          ("token position (0-indexed)", summary.position)):
        if not counts:
            lines.append(Text(f"  {title}: (the corpus has no UD annotations)"))
            continue
        lines.append(Text(f"  {title}:"))
        top = max(counts.values())
        for label, count in counts.items():
            lines.append(Text(f"    {label:<14} {count:>4} {'#' * max(1, round(BAR * count / top))}"))
    return lines
