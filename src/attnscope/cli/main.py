"""Entry point: parse, dispatch, and turn user errors into one line and exit code 2."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import re
import sys
from collections.abc import Sequence

from attnscope import __version__
from attnscope.cli.common import integer
from attnscope.errors import AttnscopeError
from attnscope.placement import using_threads

# Each module registers its subcommands with register(subparsers).
COMMAND_MODULES = (
    "attnscope.cli.core",
    "attnscope.cli.serve",
    "attnscope.cli.rollout",
    "attnscope.cli.view",
    "attnscope.cli.stats",
    "attnscope.cli.generate",
    "attnscope.cli.interventions",
    "attnscope.cli.attribute",
    "attnscope.cli.faithfulness",
    "attnscope.cli.corpus",
    "attnscope.cli.explore",
)


# Library parameters whose flag is not the parameter's name with dashes (max_length -> --max-length).
FLAGS = {"text_pair": "--pair", "max_body_bytes": "--max-body", "cache_entries": "--cache",
         "max_memory_bytes": "--max-memory", "max_response_bytes": "--max-response", "max_list_values": "--max-list",
         "cache_bytes": "--cache-size"}


def flag_of(parameter: str) -> str:
    return FLAGS.get(parameter, "--" + parameter.replace("_", "-"))


def error_line(exc: AttnscopeError) -> str:
    """The library's message in the CLI's words: the parameter it names becomes its flag."""
    text = str(exc)
    if exc.parameter:  # `max_length=9` reads `--max-length 9`, `max_length 2` reads `--max-length 2`
        flag = flag_of(exc.parameter)
        text = re.sub(rf"(?<![\w-]){re.escape(exc.parameter)}(?:(=)|(?!\w))",
                      lambda m: flag + (" " if m.group(1) else ""), text)
        text = text.replace(f"{flag} True", flag)  # `resume=True` reads `--resume`, a switch
    return text


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"attnscope: error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="attnscope", description="Open up the self-attention inside real transformer models.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    parser.add_argument("--version", action="version", version=f"attnscope {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    for command in sub.choices.values():
        if not any("--threads" in a.option_strings for a in command._actions):  # serve has its own
            command.add_argument("--threads", type=integer, default=None, metavar="N",
                                 help="torch threads (default: the idle cores, from the load average; 0: torch's "
                                      "default, one per core)")
    return parser


def _log_to_stderr(debug: bool) -> logging.Handler:
    """The library logs; the CLI shows its warnings as `warning: ...` lines on stderr."""
    handler = logging.StreamHandler(sys.stderr)
    fmt = "%(levelname)s %(name)s: %(message)s" if debug else "warning: %(message)s"
    handler.setFormatter(logging.Formatter(fmt))
    logger = logging.getLogger("attnscope")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG if debug else logging.WARNING)
    logger.propagate = debug
    return handler


def _quiet_libraries(debug: bool) -> None:
    if not debug:  # read by transformers and huggingface_hub when they are imported
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    _quiet_libraries("--debug" in argv)  # before anything imports transformers
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = _log_to_stderr(args.debug)
    try:
        if args.command == "serve":  # the server sets its own threads (serve --threads)
            return int(args.func(args))
        with using_threads(args.threads):
            return int(args.func(args))
    except AttnscopeError as exc:
        if args.debug:
            raise
        print(f"attnscope: error: {error_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("attnscope: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except OSError as exc:  # a file or directory of the user's that cannot be read or written
        if args.debug:
            raise
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"attnscope: error: {where}{exc.strerror or exc} (check the path, its permissions and the free space; "
              "--debug shows the traceback)", file=sys.stderr)
        return 2
    finally:
        logging.getLogger("attnscope").removeHandler(handler)


if __name__ == "__main__":
    sys.exit(main())
