"""Arguments and output helpers shared by every command."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from attnscope.errors import AttnscopeError, read_path
from attnscope.numbers import finite_or_null, parse_float, parse_int
from attnscope.placement import DTYPES, validate_device_name

if TYPE_CHECKING:
    from attnscope.models import Model
    from attnscope.stats.distributed import Engine
    from attnscope.stats.sources import Source

FORMATS = ("text", "markdown", "json")


def add_text_args(p: argparse.ArgumentParser, pair: bool = True) -> None:
    """TEXT or --text-file, with the model options every traced command takes."""
    p.add_argument("text", nargs="?", metavar="TEXT", help="the sentence to trace")
    p.add_argument("--text-file", metavar="PATH", help="read TEXT from a UTF-8 file instead")
    p.add_argument("--max-text-mb", type=real, default=MAX_TEXT_MB, metavar="MB",
                   help=f"refuse a --text-file larger than this (default {MAX_TEXT_MB})")
    if pair:
        p.add_argument("--pair", metavar="TEXT_B", help="a second sentence (segment B)")
    add_model_args(p, placement=True)


def add_model_args(p: argparse.ArgumentParser, placement: bool = False) -> None:
    """--model, --max-length, --no-truncate; placement adds --device and --dtype (read by model_of)."""
    p.add_argument("--model", metavar="M", default=None,
                   help="Hugging Face id, local checkpoint directory or .gguf file, or smollm2 (the bundled "
                        "SmolLM2-135M-Instruct) (default: the bundled all-MiniLM-L6-v2)")
    p.add_argument("--max-length", type=integer, default=None, metavar="N",
                   help="maximum tokens, special tokens included (default: the smaller of 256 and the positions "
                        "the model reads)")
    p.add_argument("--no-truncate", action="store_true", help="make over-long text an error instead of truncating")
    if placement:
        p.add_argument("--device", type=_device, default=None, metavar="D",
                       help="cpu (default), cuda, cuda:N or mps")
        p.add_argument("--dtype", choices=DTYPES, default=None,
                       help="float32 (default), bfloat16 or float16; the check's tolerance follows it "
                            "(1e-5, 0.66, 0.082: docs/models.md)")


SOURCE_HELP = ("a .txt (one document per line), .jsonl, .csv, .tsv, .parquet or .conllu file, or a directory of "
               ".txt files")


def add_source_args(p: argparse.ArgumentParser, source_help: str = SOURCE_HELP) -> None:
    """SOURCE and how to read it (--field, --column, --strict): the corpus commands' (stats, index, faithfulness)
    arguments, read by source_of."""
    p.add_argument("source", metavar="SOURCE", help=source_help)
    p.add_argument("--field", metavar="NAME", help="the text field of a .jsonl source (default: text)")
    p.add_argument("--column", metavar="NAME", help="the text column of a .csv/.tsv/.parquet source")
    p.add_argument("--strict", action="store_true", help="stop at the first malformed row instead of skipping it")


def source_of(args: argparse.Namespace, kind: type[Source] | None = None) -> Source:
    """The corpus add_source_args named (kind: a Source subclass, e.g. the index's TaggedSource)."""
    from attnscope.stats.sources import Source

    return (kind or Source)(args.source, field=args.field, column=args.column, strict=args.strict)


def add_engine_args(p: argparse.ArgumentParser, items: str = "batches") -> None:
    """--engine local|ray with --address and --workers (read by engine_of)."""
    p.add_argument("--engine", choices=("local", "ray"), default="local",
                   help=f"run the {items} here, or on Ray workers (pip install 'attnscope[ray]'); same numbers")
    p.add_argument("--address", metavar="ADDR",
                   help="--engine ray: the cluster to join (auto, ray://HOST:10001); default: a local Ray runtime")
    p.add_argument("--workers", type=integer, metavar="N",
                   help="--engine ray: worker processes, each loading the model once (default: one per node)")


def engine_of(args: argparse.Namespace) -> Engine:
    """The engine add_engine_args' flags ask for, checked in the flags' words: the cluster options only with
    --engine ray, --device and --dtype only without it, a missing Ray before any model loads. Ray workers load
    --model by name (a hub name, smollm2, the bundled model); a local checkpoint directory is shipped to them."""
    from attnscope.stats.distributed import Engine, require_ray

    if args.engine != "ray":
        if args.address is not None or args.workers is not None:
            raise AttnscopeError("--address and --workers choose where a Ray run goes: add --engine ray")
        return Engine()
    if getattr(args, "device", None) is not None or getattr(args, "dtype", None) is not None:
        raise AttnscopeError("--device and --dtype place the model of a local run: drop them with --engine ray")
    require_ray("--engine ray")
    return Engine.of("ray", args.workers, args.address, model=args.model)


def integer(text: str) -> int:
    """argparse type: an integer in ASCII digits (numbers.parse_int)."""
    try:
        return parse_int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def real(text: str) -> float:
    """argparse type: a decimal number in ASCII (numbers.parse_float); range checks follow."""
    try:
        return parse_float(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _device(name: str) -> str:
    try:
        return validate_device_name(name)
    except AttnscopeError as exc:
        raise argparse.ArgumentTypeError(f"{name!r} is not a device: use cpu, cuda, cuda:N or mps") from exc


def model_of(args: argparse.Namespace) -> Model:
    """The model a command's --model, --device and --dtype name (loaded once per process)."""
    from attnscope.models import load_model
    from attnscope.tokens import fitting_max_length

    m = load_model(args.model, device=getattr(args, "device", None), dtype=getattr(args, "dtype", None))
    if getattr(args, "max_length", 0) is None:  # not given: a default that fits this model (BART reads 128 or more)
        args.max_length = fitting_max_length(m.max_positions)
    return m


def add_format(p: argparse.ArgumentParser, choices: tuple[str, ...] = FORMATS) -> None:
    p.add_argument("--format", choices=choices, default=choices[0], help=f"output format (default {choices[0]})")


def read_text(args: argparse.Namespace) -> str:
    """TEXT from the argument or from --text-file, never both, never empty."""
    if args.text_file and args.text is not None:
        raise AttnscopeError("give TEXT or --text-file, not both")
    if args.text_file:
        return read_text_file(args.text_file, getattr(args, "max_text_mb", MAX_TEXT_MB))
    if args.text is None:
        raise AttnscopeError("no text given: pass TEXT or --text-file PATH")
    return str(args.text)


MAX_TEXT_MB = 10  # --max-text-mb: a text file read whole (a sentence, a prompt, a reference list)


def read_text_file(path: str, max_mb: float = MAX_TEXT_MB) -> str:
    """A UTF-8 text file, refused past max_mb without reading further (/dev/zero would never end)."""
    limit = int(max_mb * 2**20)

    def read(p: Path) -> str:
        with p.open("rb") as f:
            data = f.read(limit + 1)
        if len(data) > limit:
            raise AttnscopeError(f"cannot read {p}: it is over the limit of {max_mb:g} MB for a text file: give a "
                                 "shorter text, or raise --max-text-mb")
        return data.decode("utf-8")

    return read_path(path, read, "a text file").strip("\n")


def console() -> Console:
    return Console(soft_wrap=False, highlight=False)


def print_json(data: Any) -> None:
    """Strict JSON on stdout: NaN and infinities as null (numbers.finite_or_null)."""
    sys.stdout.write(json.dumps(finite_or_null(data), ensure_ascii=False, allow_nan=False) + "\n")


def emit_walkthrough(w: Any, fmt: str, full: bool = False) -> None:
    """Print a walkthrough (explain, explain --step, the toy) as text, Markdown or JSON."""
    from attnscope.explain.render import walkthrough_json, walkthrough_markdown, walkthrough_renderables

    if fmt == "json":
        print_json(walkthrough_json(w))
    elif fmt == "markdown":
        sys.stdout.write(walkthrough_markdown(w, full))
    else:
        out = console()
        out.print(*walkthrough_renderables(w, width=out.width, full=full))


def rich_steps_table(title: str, columns: Sequence[str], rows: Iterable[Sequence[str]]) -> Any:
    """A rich table of generation steps (this and `attnscope generate` of encoder-decoder models): numbers right."""
    from rich.markup import escape
    from rich.table import Table

    t = Table(title=title, title_justify="left")
    for c in columns:
        t.add_column(c, justify="right" if c in ("step", "pos", "p") else "left")
    for row in rows:
        t.add_row(*(escape(c) for c in row))
    return t


class ProgressBar:
    """tqdm over a corpus pass: documents, tokens/s when the pass counts tokens, the ETA (on stderr; silent when
    not a terminal). update() takes any pass's progress record with `documents` (and `tokens`, `seconds`)."""

    def __init__(self, total: int | None):
        from tqdm import tqdm

        self.total = total
        self.bar = tqdm(total=total, unit="doc", file=sys.stderr, disable=None, dynamic_ncols=True)
        self.first: Any = None

    def update(self, p: Any) -> None:
        if self.first is None:  # a resumed pass starts where its checkpoint was
            self.first = p
            self.bar.n = p.documents
        self.bar.update(p.documents - self.bar.n)
        tokens = getattr(p, "tokens", None)
        if tokens is not None and p.seconds > 0:
            self.bar.set_postfix_str(f"{(tokens - self.first.tokens) / p.seconds:.0f} tok/s", refresh=False)

    def close(self) -> None:
        self.bar.close()


def add_progress(p: argparse.ArgumentParser) -> None:
    """--no-progress: the corpus passes' one flag for their bar."""
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def progress_bar(args: argparse.Namespace, source: Any, limit: int | None) -> ProgressBar | None:
    """The pass's bar over source.count(limit) documents, or None with --no-progress (then the source is not
    read twice: a bad row later in it is met by the pass, after the documents before it are checkpointed)."""
    return None if args.no_progress else ProgressBar(source.count(limit))

