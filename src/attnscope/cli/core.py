"""explain, toy, trace and check: the Core commands."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from attnscope.cli.common import (
    add_format,
    add_text_args,
    console,
    emit_walkthrough,
    integer,
    model_of,
    print_json,
    read_text,
)
from attnscope.cli.generate import add_step_args
from attnscope.errors import AttnscopeError
from attnscope.records.trace import EncoderDecoderTrace
from attnscope.stages import ATTENTION_KINDS, ATTENTION_LABELS

if TYPE_CHECKING:
    from attnscope.tracing.one_pass import Trace

# Heavy imports (torch, transformers) happen inside the commands, so --help and input errors are instant.


def register(sub: Any) -> None:
    p = sub.add_parser("explain", help="walk through one layer and head step by step with real numbers",
                       epilog="exit status: 0; 2 bad input. With --attribution: 0 every check PASS, 1 a check "
                              "FAILS, 2 bad input (an unknown method, one without a walkthrough or that does not "
                              "apply to the model, --token out of range), 3 a check is NOT VERIFIED")
    add_text_args(p)
    p.add_argument("--layer", type=integer, default=None,
                   help="layer, 0-indexed (default 0; with --attribution, the layer shown: default the last)")
    p.add_argument("--head", type=integer, default=None, help="head, 0-indexed (default 0)")
    p.add_argument("--token", type=integer, default=None,
                   help="focus on one query token (0-indexed): adds its weighted values and their sum; with "
                        "--attribution, the input token I whose score is walked through (required)")
    p.add_argument("--full", action="store_true", help="print every row and column (wide tables in blocks)")
    p.add_argument("--attribution", metavar="METHOD", default=None,
                   help="walk through one attribution method for input token --token instead of a head: "
                        f"{', '.join(ATTRIBUTION_WALKS)} (attnscope attribute runs them all)")
    p.add_argument("--ig-steps", type=integer, default=None, metavar="N",
                   help="--attribution integrated_gradients: the first number of steps (default 32, doubled until "
                        "completeness holds)")
    p.add_argument("--ig-max-steps", type=integer, default=None, metavar="N",
                   help="--attribution integrated_gradients: the cap on steps (default 512)")
    add_target_args(p)
    p.add_argument("--attention", choices=ATTENTION_KINDS, default=None,
                   help="encoder-decoder models: the kind of attention to explain (default: cross)")
    add_step_args(p)  # --step N, --generation FILE: one step of a generation (attnscope.cli.generate)
    add_format(p)
    p.set_defaults(func=run_explain)

    p = sub.add_parser("toy", help="the classic 3-input self-attention example, computed by hand")
    p.add_argument("--no-scale", action="store_true", help="skip the / sqrt(d_k) step, as many tutorials do")
    p.add_argument("--causal", action="store_true", help="a decoder's causal mask: -inf above the diagonal")
    add_format(p)
    p.set_defaults(func=run_toy)

    p = sub.add_parser("trace", help="trace a text and save every stage (.safetensors or .npz)")
    add_text_args(p)
    add_target_args(p)
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="FILE.safetensors or FILE.npz")
    add_format(p)
    p.set_defaults(func=run_trace)

    p = sub.add_parser("check", help="verify the captured attention against an independent recompute",
                       epilog="exit status: 0 PASS; 1 FAIL (a number differs beyond the tolerance); 2 bad input; "
                       "3 NOT VERIFIED (traced, but a step of this model's attention is not recomputed: the "
                       "message names it)")
    add_text_args(p)
    add_target_args(p)
    p.add_argument("--attention", choices=ATTENTION_KINDS, default=None,
                   help="encoder-decoder models: check only this kind of attention (default: all three)")
    add_format(p)
    p.set_defaults(func=run_check)


# the methods explain --attribution walks through (attnscope.explain.attribution.WALKED; a test keeps them equal)
ATTRIBUTION_WALKS = ("integrated_gradients", "alti", "value_zeroing", "rollout", "attention", "saliency",
                     "input_x_gradient", "leave_one_out", "leave_one_out_replaced")


def add_target_args(p: argparse.ArgumentParser) -> None:
    """--target and --max-new-tokens: an encoder-decoder model's target (TEXT is then the source)."""
    p.add_argument("--target", metavar="TARGET", default=None,
                   help="encoder-decoder models (T5, BART, Marian): the target, fed to the decoder teacher-forced "
                        "(default: generated greedily from TEXT, the source)")
    p.add_argument("--max-new-tokens", type=integer, default=20, metavar="N",
                   help="encoder-decoder models without --target: generate at most N target tokens (default 20)")


def traced_any(args: argparse.Namespace) -> Trace | EncoderDecoderTrace:
    """The trace a command asked for: an EncoderDecoderTrace for an encoder-decoder model (TEXT is the source,
    --target the target), a Trace otherwise (where --target is a one-line error)."""
    from attnscope.errors import require_text

    text = require_text(read_text(args), "source" if getattr(args, "target", None) is not None else "text")
    if getattr(args, "target", None) is not None:
        require_text(args.target, "target (--target)")
    from attnscope import families

    m = model_of(args)
    if not families.is_encoder_decoder(m.model):
        if getattr(args, "target", None) is not None:
            raise AttnscopeError(f"--target is for encoder-decoder models (T5, BART, Marian): {m.name} "
                                 f"({m.architecture}) is not one, so trace TEXT alone (drop --target)")
        return traced(args)
    if getattr(args, "pair", None) is not None:
        raise AttnscopeError(f"--pair is a second sentence for an encoder (BERT-style segments): {m.name} "
                             f"({m.architecture}) is an encoder-decoder, which reads TEXT as its source and --target "
                             "as its target: drop --pair")
    from attnscope.tracing.seq2seq import trace_seq2seq

    target: str | None = args.target
    return trace_seq2seq(text, target, model=m, max_length=args.max_length, truncate=not args.no_truncate,
                         max_new_tokens=args.max_new_tokens)


def require_encoder_decoder(m: Any, flag: str) -> None:
    """A one-line error naming the flag when m is not an encoder-decoder model."""
    from attnscope import families

    if not families.is_encoder_decoder(m.model):
        raise AttnscopeError(f"{flag} is for encoder-decoder models (T5, BART, Marian): {m.name} ({m.architecture}) "
                             f"has one kind of attention, so drop {flag}")


def traced(args: argparse.Namespace) -> Trace:
    """The trace a command asked for, from its TEXT/--text-file, --pair and model options."""
    from attnscope.errors import require_text

    text = require_text(read_text(args))  # before the heavy imports: input errors are instant
    pair: str | None = getattr(args, "pair", None)
    if pair is not None:
        require_text(pair, "second text (--pair)")
    from attnscope.tracing.one_pass import trace

    model = model_of(args)
    return trace(text, pair, model=model, max_length=args.max_length, truncate=not args.no_truncate)


def run_explain(args: argparse.Namespace) -> int:
    if args.attribution is not None:
        return run_explain_attribution(args)
    for flag, given in (("--ig-steps", args.ig_steps), ("--ig-max-steps", args.ig_max_steps)):
        if given is not None:
            raise AttnscopeError(f"{flag} is for explain --attribution integrated_gradients: drop it")
    args.layer = 0 if args.layer is None else args.layer
    args.head = 0 if args.head is None else args.head
    if (args.step is not None or args.generation is not None) and (args.target is not None or args.attention):
        raise AttnscopeError("--step and --generation explain a decoder's generation step: for an encoder-decoder "
                             "model give the target (attnscope generate SOURCE shows it) with --target and --token")
    if args.step is not None or args.generation is not None:
        from attnscope.cli.generate import run_explain_step

        return run_explain_step(args)
    if args.attention is not None:  # before tracing: a model with one kind of attention has nothing to choose
        require_encoder_decoder(model_of(args), "--attention")
    tr = traced_any(args)
    from attnscope.explain.from_trace import walkthrough

    w = walkthrough(tr, args.layer, args.head, args.token, model=model_of(args), attention=args.attention)
    emit_walkthrough(w, args.format, args.full)
    return 0


def run_explain_attribution(args: argparse.Namespace) -> int:
    """explain --attribution METHOD --token I: one attribution method's walkthrough; the exit code of its checks."""
    from attnscope.errors import require_text

    text = require_text(read_text(args))  # every input error before the model loads
    for flag, given in (("--head", args.head), ("--step", args.step), ("--generation", args.generation),
                        ("--attention", args.attention), ("--pair", args.pair)):
        if given is not None:
            raise AttnscopeError(f"{flag} is not read by explain --attribution: drop it (--layer chooses the layer "
                                 "shown, --target the continuation explained)")
    if args.token is None:
        raise AttnscopeError("explain --attribution needs --token I, the input token (0-indexed) whose score is "
                             "walked through")
    if args.target is not None and not args.target:
        raise AttnscopeError("the target is empty: give a continuation such as ' Paris', or drop --target")
    from attnscope.explain import attribution as walks

    walks.require_walked(args.attribution)
    settings = {k: getattr(args, k) for k in ("ig_steps", "ig_max_steps") if getattr(args, k) is not None}
    w = walks.attribution_walkthrough(text, args.attribution, args.token, model=model_of(args), target=args.target,
                                      layer=args.layer, max_length=args.max_length, truncate=not args.no_truncate,
                                      **settings)
    if args.format == "json":
        print_json(walks.json_data(w))
    elif args.format == "markdown":
        sys.stdout.write(walks.markdown(w, args.full))
    else:
        out = console()
        out.print(*walks.renderables(w, width=out.width, full=args.full))
    return w.exit_code


def run_toy(args: argparse.Namespace) -> int:
    from attnscope.explain.toy import toy_walkthrough

    emit_walkthrough(toy_walkthrough(scale=not args.no_scale, causal=args.causal), args.format, full=True)
    return 0


def run_trace(args: argparse.Namespace) -> int:
    from attnscope.explain.render import check_summary

    tr = traced_any(args)
    if isinstance(tr, EncoderDecoderTrace):
        return _trace_seq2seq(tr, args)
    tr.save(args.output)
    report = tr.check()
    if args.format == "json":
        print_json({"path": args.output, "tokens": tr.n_tokens, "layers": tr.n_layers, "heads": tr.n_heads,
                    "ok": report.ok, "max_error": report.max_error})
    else:
        print(f"wrote {args.output}: {tr.n_tokens} tokens x {tr.n_layers} layers x {tr.n_heads} heads; "
              f"{check_summary(report)}")
    return 0


def run_check(args: argparse.Namespace) -> int:
    from attnscope.explain.render import check_markdown, check_summary, check_table

    if args.attention is not None and args.target is None:
        raise AttnscopeError("--attention chooses a kind of an encoder-decoder model's attention: give --target too")
    tr = traced_any(args)
    if isinstance(tr, EncoderDecoderTrace):
        return _check_seq2seq(tr, args)
    report = tr.check()
    if args.format == "json":
        print_json({"model": tr.model, "tokens": tr.token_strings, **report.to_dict()})
    elif args.format == "markdown":
        sys.stdout.write(check_markdown(report, tr.n_layers, f"**{_check_header(tr)}**"))
    else:
        out = console()
        out.print(_check_header(tr))
        if report.comparisons:
            out.print(check_table(report, tr.n_layers, out.width))
        out.print(check_summary(report))
    from attnscope.records.check_report import EXIT_CODES

    return EXIT_CODES[report.status]  # 0 PASS, 1 FAIL, 3 NOT VERIFIED (2 is bad input)


def _check_header(tr: Trace) -> str:
    return (f"{tr.model['name']} ({tr.model['architecture']}): {tr.n_tokens} tokens, "
            f"{tr.n_layers} layers x {tr.n_heads} heads")


def _kinds_of(tr: EncoderDecoderTrace, only: str | None) -> dict[str, Trace]:
    return {k: t for k, t in tr.kinds.items() if only is None or k == only}


def _kind_header(tr: Trace) -> str:
    keys = f" x {tr.n_keys} source tokens" if tr.attention == "cross" else ""
    return (f"{ATTENTION_LABELS[tr.attention]}: {tr.n_tokens} {'source' if tr.attention == 'encoder' else 'target'} "
            f"tokens{keys}, {tr.n_layers} layers x {tr.n_heads} heads")


def _seq2seq_header(tr: EncoderDecoderTrace) -> str:
    how = "generated greedily" if tr.generated else "teacher-forced"
    return (f"{tr.model['name']} ({tr.model['architecture']}): source {tr.source!r}, target {tr.target_text!r} "
            f"({how}; decoder input: {' '.join(tr.decoder.token_strings)})")


def _check_seq2seq(tr: EncoderDecoderTrace, args: argparse.Namespace) -> int:
    """A table per kind of attention; the exit code of the worst verdict."""
    from attnscope.explain.render import check_markdown, check_summary, check_table
    from attnscope.records.check_report import EXIT_CODES, FAIL, NOT_VERIFIED, PASS

    kinds = _kinds_of(tr, args.attention)
    reports = {k: t.check() for k, t in kinds.items()}
    statuses = {r.status for r in reports.values()}
    status = next(s for s in (FAIL, NOT_VERIFIED, PASS) if s in statuses)
    if args.format == "json":
        print_json({"model": tr.model, "source": tr.source, "target": tr.target_text, "generated": tr.generated,
                    "status": status, "kinds": {k: {"tokens": t.token_strings, "keys": [x.text for x in t.keys],
                                                    **reports[k].to_dict()} for k, t in kinds.items()}})
    elif args.format == "markdown":
        sys.stdout.write(f"**{_seq2seq_header(tr)}**\n\n")
        for k, t in kinds.items():
            sys.stdout.write(check_markdown(reports[k], t.n_layers, f"**{_kind_header(t)}**") + "\n")
    else:
        out = console()
        out.print(_seq2seq_header(tr))
        for k, t in kinds.items():
            out.print(f"\n{_kind_header(t)}")
            if reports[k].comparisons:
                out.print(check_table(reports[k], t.n_layers, out.width))
            out.print(check_summary(reports[k]))
        out.print(f"\n{status}: {', '.join(f'{k} {r.status}' for k, r in reports.items())}")
    return EXIT_CODES[status]


def _trace_seq2seq(tr: EncoderDecoderTrace, args: argparse.Namespace) -> int:
    from attnscope.explain.render import check_summary

    tr.save(args.output)
    if args.format == "json":
        print_json({"path": args.output, "status": tr.status(), "generated": tr.generated,
                    "kinds": {k: {"tokens": t.n_tokens, "keys": t.n_keys, "layers": t.n_layers, "heads": t.n_heads,
                                  "ok": t.check().ok, "max_error": t.check().max_error} for k, t in tr.kinds.items()}})
    else:
        print(f"wrote {args.output}: {_seq2seq_header(tr)}")
        for t in tr.kinds.values():
            print(f"  {_kind_header(t)}; {check_summary(t.check())}")
    return 0
