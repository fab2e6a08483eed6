"""attribute: which input tokens carry a prediction, by every method, each beside its check."""

from __future__ import annotations

import argparse
import io
import json
import sys
from typing import Any

from attnscope.cli.common import add_format, add_text_args, console, integer, model_of, read_text, real
from attnscope.errors import AttnscopeError, require_text

# Heavy imports (torch, transformers, captum) happen inside the command, so --help and input errors are instant.
SETTINGS = ("layer", "head", "ig_steps", "ig_max_steps", "ig_tolerance", "max_flow_tokens", "max_perturb_tokens")


def register(sub: Any) -> None:
    p = sub.add_parser(
        "attribute", help="which input tokens carry the prediction: attention, gradient and leave-one-out methods",
        description="Scores each input token for one prediction by each method, the method's check beside its "
                    "scores. What is explained: a causal LM's log-probability of each target token (default: its "
                    "greedy next token); an encoder-decoder's, given the source; an encoder's pooled sentence "
                    "embedding's cosine similarity with the unperturbed one.",
        epilog="exit status: 0 every check PASS; 1 a check FAILS; 2 bad input (an unknown method, one that does not "
               "apply to the model, a text beyond a method's budget); 3 a check is NOT VERIFIED")
    add_text_args(p, pair=False)
    p.add_argument("--target", metavar="T", default=None,
                   help="the continuation explained, e.g. ' Paris' (causal LMs and encoder-decoders; default: the "
                        "model's greedy next token)")
    p.add_argument("--methods", metavar="M1,M2", default=None,
                   help="methods to run, comma-separated, or all (default: every method but flow that applies)")
    p.add_argument("--layer", type=integer, default=None,
                   help="attention, attention_x_gradient, rollout: the layer, 0-indexed (default: the last)")
    p.add_argument("--head", type=integer, default=None,
                   help="attention, attention_x_gradient: one head, 0-indexed (default: the mean of the heads)")
    p.add_argument("--ig-steps", type=integer, default=32, metavar="N",
                   help="integrated gradients: the first number of steps (default 32, doubled until complete)")
    p.add_argument("--ig-max-steps", type=integer, default=512, metavar="N",
                   help="integrated gradients: the cap on steps (default 512)")
    p.add_argument("--ig-tolerance", type=real, default=0.01, metavar="F",
                   help="integrated gradients: the completeness wanted, a fraction of f(x) - f(baseline) (0.01)")
    p.add_argument("--max-flow-tokens", type=integer, default=64, metavar="N",
                   help="flow: refuse longer inputs, its cost grows like tokens^4 (default 64)")
    p.add_argument("--max-perturb-tokens", type=integer, default=256, metavar="N",
                   help="leave-one-out: refuse longer inputs, it runs tokens + 1 forwards (default 256)")
    p.add_argument("-o", "--output", metavar="FILE", default=None, help="write the output to FILE, not stdout")
    p.add_argument("--html", metavar="FILE", default=None,
                   help="also write the view as a self-contained HTML page (heatmap, a token's ranks, agreement)")
    p.add_argument("--figure", metavar="FILE", default=None,
                   help="also write the view as a figure: FILE.svg, FILE.png or FILE.pdf")
    p.add_argument("--colours", choices=("method", "shared"), default="method",
                   help="the view's colour scale: each method's own largest |score| (method) or one for all (shared)")
    p.add_argument("--raw-tokens", action="store_true",
                   help="print tokens as the tokenizer spells its pieces ('Ġworld'), not as they read")
    add_format(p)
    p.set_defaults(func=run_attribute)


def run_attribute(args: argparse.Namespace) -> int:
    text = require_text(read_text(args))
    if args.target is not None and not args.target:
        raise AttnscopeError("the target is empty: give a continuation such as ' Paris', or drop --target")
    from attnscope.attribution.api import attribute_objective, make_settings
    from attnscope.attribution.methods import method_names
    from attnscope.attribution.objective import build_objective

    names = method_names(args.methods)  # an unknown method fails before the model loads
    if args.figure is not None:  # a bad suffix fails before the model loads too
        from attnscope.views.figures import figure_format

        figure_format(args.figure)
    settings = make_settings(**{k: getattr(args, k) for k in SETTINGS if getattr(args, k) is not None})
    m = model_of(args)
    obj = build_objective(m, text, args.target, max_length=args.max_length, truncate=not args.no_truncate)
    result = attribute_objective(obj, names, settings, explicit=args.methods not in (None, "all"))
    _emit(result, args.format, args.output, raw_tokens=args.raw_tokens)
    _write_views(result, args)
    return result.exit_code


def _write_views(result: Any, args: argparse.Namespace) -> None:
    """--html and --figure: the attribution view as a page and as a figure."""
    from attnscope.views.attribution import attribution_figure, save_attribution_html

    if args.html is not None:
        save_attribution_html(result, args.html, colours=args.colours)
    if args.figure is not None:
        attribution_figure(result, args.figure, colours=args.colours)


def _emit(result: Any, fmt: str, path: str | None, raw_tokens: bool = False) -> None:
    from attnscope.attribution import render
    from attnscope.numbers import finite_or_null

    if fmt == "json":
        text = json.dumps(finite_or_null(render.json_data(result)), ensure_ascii=False, allow_nan=False) + "\n"
    elif fmt == "markdown":
        text = render.markdown(result, raw_tokens=raw_tokens)
    else:
        out = console() if path is None else _file_console()
        out.width = max(out.width, 24 + 10 * len(result.methods))  # a column per method: wider than squeezed
        for r in render.text_renderables(result, raw_tokens=raw_tokens):
            out.print(r)
        if path is None:
            return
        text = str(out.file.getvalue())  # type: ignore[union-attr]
    if path is None:
        sys.stdout.write(text)
    else:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)


def _file_console() -> Any:
    from rich.console import Console

    return Console(file=io.StringIO(), width=200, soft_wrap=False, highlight=False, color_system=None)
