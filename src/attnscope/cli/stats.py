"""attnscope stats: per-head attention statistics over a corpus (Clark et al. 2019)."""

from __future__ import annotations

import argparse
import functools
import re
import sys
from collections.abc import Callable
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
    source_of,
)
from attnscope.errors import AttnscopeError

if TYPE_CHECKING:
    from attnscope.stats.engine import RunResult
    from attnscope.stats.outputs import Written
    from attnscope.stats.settings import Settings

# torch, transformers and the engine are imported when the command runs, so --help stays instant.


def register(sub: Any) -> None:
    p = sub.add_parser("stats", help="per-head attention statistics over a corpus, with tables, plots and a report")
    add_source_args(p, "a .txt (one document per line), .jsonl, .csv, .tsv, .parquet or .conllu file, "
                       "a directory of .txt files, or sklearn:20newsgroups[:train|:test]")
    p.add_argument("-o", "--output", required=True, metavar="OUTDIR", help="directory for the results")
    p.add_argument("--resume", action="store_true", help="continue the run checkpointed in OUTDIR")
    add_model_args(p, placement=True)
    p.add_argument("--batch-size", type=integer, default=32, metavar="N", help="documents per batch (default 32)")
    p.add_argument("--limit", type=integer, default=None, metavar="N", help="read only the first N documents")
    p.add_argument("--word-level", action="store_true",
                   help="statistics between words (to a word: sum over its pieces; from a word: their mean)")
    p.add_argument("--checkpoint-every", type=integer, default=20, metavar="N",
                   help="write a checkpoint every N batches (default 20)")
    add_progress(p)
    p.add_argument("--format", choices=("text", "json"), default="text", help="how to report the run (default text)")
    add_engine_args(p)
    p.add_argument("--norms", action="store_true",
                   help="also the norm-weighted [CLS]/[SEP]/punctuation/other averages (Kobayashi et al. 2020)")
    p.set_defaults(func=run_stats)


def settings_of(args: argparse.Namespace) -> Settings:
    from attnscope.stats.settings import Settings

    return Settings(max_length=args.max_length, batch_size=args.batch_size, word_level=args.word_level,
                    truncate=not args.no_truncate, limit=args.limit,
                    checkpoint_every=max(1, args.checkpoint_every), metric_sets=("norms",) if args.norms else ())


# The library names its parameters. The one an error is about (AttnscopeError.parameter) becomes its flag in
# attnscope.cli.main; these are the other parameters a stats message can name, in this command's words.
FLAGS: tuple[tuple[str, str], ...] = (
    (r"\bresume=True\b", "--resume"),
    (r"\btruncate=False\b", "--no-truncate"),
    (r"\bset truncate=True\b", "drop --no-truncate"),
    (r"\bstrict=True\b", "--strict"),
    (r"\bmetric_sets=\('norms',\)", "--norms"),
    (r"\boutdir\b", "-o OUTDIR"),
)


def as_flags(message: str) -> str:
    """A library message with the parameters it names besides its own as this command's options."""
    for pattern, flag in FLAGS:
        message = re.sub(pattern, flag, message)
    return message


def run_stats(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except AttnscopeError as exc:
        raise AttnscopeError(as_flags(str(exc)), parameter=exc.parameter) from exc


def _runner(args: argparse.Namespace) -> Callable[..., RunResult]:
    """`attnscope.stats.run`, or the Ray engine's bound to the cluster options (a missing Ray is reported here,
    before any model loads). Workers load a hub name or the bundled model themselves; a local checkpoint
    directory is shipped from this process."""
    engine = engine_of(args)
    if engine.name != "ray":
        from attnscope.stats.engine import run

        return run
    from attnscope.stats.distributed import run as run_on_ray

    return functools.partial(run_on_ray, address=engine.address, workers=engine.workers,
                             worker_model=engine.worker_model)


def _run(args: argparse.Namespace) -> int:
    from attnscope.stats.outputs import write_outputs

    source = source_of(args)
    run = _runner(args)
    model = model_of(args)  # first: --max-length's default fits the model
    settings = settings_of(args)
    bar = progress_bar(args, source, settings.limit)
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
    run_info = {"settings": settings.to_json(), "seconds": round(result.seconds, 3),
                "tokens_per_second": (state.tokens - result.resumed_tokens) / result.seconds
                if result.seconds > 0 else float("nan"),
                "resumed_from_documents": result.resumed_from, "engine": args.engine,
                "norms": args.norms}
    written = write_outputs(state, model, args.output, {**source.describe(), "malformed": result.malformed},
                            run_info, settings)
    if args.format == "json":
        print_json({"output": args.output, "documents": state.documents, "tokens": state.tokens,
                    "truncated": state.truncated, "malformed": result.malformed,
                    "files": [str(p) for p in written.paths]})
    else:
        _print_summary(args.output, result, run_info, written)
    return 0


def _checkpointed(out: str) -> str:
    """What the checkpoint in out holds, for the interruption message."""
    from attnscope.stats.checkpoint import saved_documents

    documents = saved_documents(out)
    if documents is None:
        return "nothing was checkpointed yet:"
    return f"{documents:,} documents are checkpointed in {out}:"


def _print_summary(out: str, result: RunResult, run_info: dict[str, Any], written: Written) -> None:
    from attnscope.stats.report_page import report_text

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
