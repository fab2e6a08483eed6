"""attnscope stats: per-head attention statistics over a corpus (Clark et al. 2019)."""

from __future__ import annotations

import argparse
import contextlib
import sys
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnscope.cli.common import add_model_args, print_json

if TYPE_CHECKING:
    from attnscope.stats.engine import Progress, RunResult, Settings
    from attnscope.stats.outputs import Written
    from attnscope.stats.sources import Source

# torch, transformers and the engine are imported when the command runs, so --help stays instant.


def register(sub: Any) -> None:
    p = sub.add_parser("stats", help="per-head attention statistics over a corpus, with tables, plots and a report")
    p.add_argument("source", metavar="SOURCE",
                   help="a .txt (one document per line), .jsonl, .csv, .tsv, .parquet or .conllu file, "
                        "a directory of .txt files, or sklearn:20newsgroups[:train|:test]")
    p.add_argument("-o", "--output", required=True, metavar="OUTDIR", help="directory for the results")
    p.add_argument("--resume", action="store_true", help="continue the run checkpointed in OUTDIR")
    p.add_argument("--field", metavar="NAME", help="the text field of a .jsonl source (default: text)")
    p.add_argument("--column", metavar="NAME", help="the text column of a .csv/.tsv/.parquet source")
    p.add_argument("--strict", action="store_true", help="stop at the first malformed row instead of skipping it")
    add_model_args(p)
    p.add_argument("--batch-size", type=int, default=32, metavar="N", help="documents per batch (default 32)")
    p.add_argument("--limit", type=int, default=None, metavar="N", help="read only the first N documents")
    p.add_argument("--word-level", action="store_true",
                   help="statistics between words (to a word: sum over its pieces; from a word: their mean)")
    p.add_argument("--checkpoint-every", type=int, default=20, metavar="N",
                   help="write a checkpoint every N batches (default 20)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--format", choices=("text", "json"), default="text", help="how to report the run (default text)")
    p.add_argument("--engine", choices=("local", "ray"), default="local",
                   help="run the batches here, or on Ray workers (pip install 'attnscope[ray]'); same numbers")
    p.add_argument("--address", metavar="ADDR",
                   help="--engine ray: the cluster to join (auto, ray://HOST:10001); default: a local Ray runtime")
    p.add_argument("--workers", type=int, metavar="N",
                   help="--engine ray: worker processes, each loading the model once (default: one per node)")
    p.add_argument("--norms", action="store_true",
                   help="also the norm-weighted [CLS]/[SEP]/punctuation/other averages (Kobayashi et al. 2020)")
    p.set_defaults(func=run_stats)


def settings_of(args: argparse.Namespace) -> Settings:
    from attnscope.stats.engine import Settings

    return Settings(max_length=args.max_length, batch_size=args.batch_size, word_level=args.word_level,
                    truncate=not args.no_truncate, limit=args.limit,
                    checkpoint_every=max(1, args.checkpoint_every))


def run_stats(args: argparse.Namespace) -> int:
    from attnscope.stats.norm_metrics import registered

    with registered() if args.norms else contextlib.nullcontext():  # the norm columns for this run only
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    from attnscope.models import load_model
    from attnscope.stats.distributed import cli_runner
    from attnscope.stats.outputs import write_outputs
    from attnscope.stats.sources import Source

    source = Source(args.source, field=args.field, column=args.column, strict=args.strict)
    settings = settings_of(args)
    run = cli_runner(args.engine, args.address, args.workers, args.model)
    model = load_model(args.model)
    bar = None if args.no_progress else _progress_bar(source, settings.limit)
    try:
        try:
            result = run(source, model, settings, args.output, resume=args.resume,
                         progress=bar.update if bar else None, total=bar.total if bar else None)
        finally:
            if bar:
                bar.close()  # before any message, so it is not printed on the bar's line
    except KeyboardInterrupt:
        print(f"attnscope: interrupted; {_checkpointed(args.output)} add --resume to the same command to continue",
              file=sys.stderr)
        return 130
    state = result.state
    run_info = {"settings": asdict(settings), "seconds": round(result.seconds, 3),
                "tokens_per_second": (state.tokens - result.resumed_tokens) / result.seconds
                if result.seconds > 0 else float("nan"),
                "resumed_from_documents": result.resumed_from, "engine": args.engine,
                "norms": args.norms}
    written = write_outputs(state, model, args.output, {**source.describe(), "malformed": result.malformed},
                            run_info)
    if args.format == "json":
        print_json({"output": args.output, "documents": state.documents, "tokens": state.tokens,
                    "truncated": state.truncated, "malformed": result.malformed,
                    "files": [str(p) for p in written.paths]})
    else:
        _print_summary(args.output, result, run_info, written)
    return 0


def _checkpointed(out: str) -> str:
    """What the checkpoint in out holds, for the interruption message."""
    import json

    from attnscope.stats.engine import CHECKPOINT

    try:
        documents = json.loads((Path(out) / CHECKPOINT).read_text(encoding="utf-8"))["state"]["documents"]
    except (OSError, ValueError, KeyError, TypeError):
        return "nothing was checkpointed yet:"
    return f"{documents:,} documents are checkpointed in {out}:"


def _print_summary(out: str, result: RunResult, run_info: dict[str, Any], written: Written) -> None:
    from attnscope.stats.report import report_text

    state = result.state
    if result.resumed_from == state.documents:
        timing = " (the checkpoint was complete: nothing left to run)"
    else:
        resumed = f" ({result.resumed_from:,} before resuming)" if result.resumed_from else ""
        timing = f" in {result.seconds:.1f} s{resumed}, {run_info['tokens_per_second']:,.0f} tokens/s"
    print(f"{state.documents:,} documents, {state.tokens:,} tokens ({state.truncated:,} truncated, "
          f"{result.malformed:,} malformed rows skipped){timing}")
    print(report_text(written.info, written.heads))
    tables = ", ".join(str(p) for p in written.paths if p.suffix in (".csv", ".parquet"))
    print(f"Tables: {tables}\nPlots: {Path(out) / 'plots'}/\nReport: {Path(out) / 'report.html'}")


class _Bar:
    """tqdm showing documents, tokens/s and the ETA (on stderr; silent when not a terminal)."""

    def __init__(self, total: int | None):
        from tqdm import tqdm

        self.total = total
        self.bar = tqdm(total=total, unit="doc", file=sys.stderr, disable=None, dynamic_ncols=True)
        self.first: Progress | None = None

    def update(self, p: Progress) -> None:
        if self.first is None:
            self.first = p
            self.bar.n = p.documents
        self.bar.update(p.documents - self.bar.n)
        if p.seconds > 0:
            self.bar.set_postfix_str(f"{(p.tokens - self.first.tokens) / p.seconds:.0f} tok/s", refresh=False)

    def close(self) -> None:
        self.bar.close()


def _progress_bar(source: Source, limit: int | None) -> _Bar:
    return _Bar(source.count(limit))
