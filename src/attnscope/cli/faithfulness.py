"""attnscope faithfulness: every attribution method's faithfulness over a corpus (ERASER, AOPC, normalised AOPC,
deletion and insertion curves, agreement with leave-one-out, random and position controls)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from attnscope.cli.common import (
    SOURCE_HELP,
    add_engine_args,
    add_progress,
    add_source_args,
    engine_of,
    integer,
    print_json,
    progress_bar,
    source_of,
)
from attnscope.errors import AttnscopeError

# torch, transformers and the run are imported when the command runs, so --help and bad flags stay instant.


def register(sub: Any) -> None:
    p = sub.add_parser("faithfulness", help="which attribution method is faithful: ERASER, AOPC, curves, over a corpus",
                       description="Per example and per method: comprehensiveness and sufficiency at 1/5/10/20/50%, "
                                   "AOPC and normalised AOPC, deletion and insertion curves, Spearman and Kendall "
                                   "with leave-one-out; controls: random orderings and the position baseline. "
                                   "Special tokens are never removed.",
                       epilog="exit status: 0 done; 2 bad input; 130 interrupted (add --resume to continue)")
    add_source_args(p, SOURCE_HELP + " (as attnscope stats reads them)")
    p.add_argument("-o", "--output", required=True, metavar="OUTDIR", help="directory for the results")
    p.add_argument("--model", metavar="M", default=None,
                   help="Hugging Face id, local checkpoint or smollm2 (default: the bundled all-MiniLM-L6-v2)")
    p.add_argument("--methods", metavar="M1,M2", default=None,
                   help="attribution methods, comma-separated, or all (default: attribute's defaults that apply)")
    p.add_argument("--removal", choices=("delete", "replace"), default="delete",
                   help="take a token out (delete, default) or put the baseline token in its place (replace); "
                        "the same for every method")
    p.add_argument("--metrics", choices=("all", "agreement"), default="all",
                   help="every metric (all, default), or only Spearman and Kendall with leave-one-out (agreement: "
                        "about m + 2 forwards per example of m removable tokens instead of thousands)")
    p.add_argument("--limit", type=integer, default=None, metavar="N", help="read only the first N documents")
    p.add_argument("--resume", action="store_true", help="continue the run checkpointed in OUTDIR")
    p.add_argument("--seeds", type=integer, default=3, metavar="N", help="random orderings per example (3)")
    p.add_argument("--max-length", type=integer, default=64, metavar="N",
                   help="tokens per example, special tokens included; longer texts are truncated (default 64)")
    p.add_argument("--exact-tokens", type=integer, default=8, metavar="N",
                   help="normalised AOPC's bounds exact up to N removable tokens (2^N forwards), beam search beyond")
    p.add_argument("--beam", type=integer, default=2, metavar="W", help="the bounds' beam width (default 2)")
    p.add_argument("--checkpoint-every", type=integer, default=1, metavar="N",
                   help="write a checkpoint every N documents (default 1)")
    add_progress(p)
    p.add_argument("--no-png", action="store_true",
                   help="write the curves as SVG only (PNG needs headless Chromium: the views extra)")
    p.add_argument("--format", choices=("text", "json"), default="text", help="how to report the run (default text)")
    add_engine_args(p, "documents")
    p.set_defaults(func=run_faithfulness)


def run_faithfulness(args: argparse.Namespace) -> int:
    source = source_of(args)  # bad path: instant
    from attnscope.attribution.methods import method_names
    from attnscope.faithfulness.run import faithfulness

    if args.methods is not None:
        method_names(args.methods)  # an unknown method fails before the model loads
    engine = engine_of(args)  # and a missing Ray
    bar = progress_bar(args, source, args.limit)
    try:
        try:
            result = faithfulness(source, args.output, args.model, args.methods, removal=args.removal,
                                  limit=args.limit, resume=args.resume, seeds=args.seeds,
                                  max_length=args.max_length, exact_tokens=args.exact_tokens, beam=args.beam,
                                  metrics=args.metrics, png=not args.no_png,
                                  checkpoint_every=args.checkpoint_every, engine=engine,
                                  progress=bar.update if bar else None)
        finally:
            if bar:
                bar.close()
    except KeyboardInterrupt:
        print(f"attnscope: interrupted; what was done is checkpointed in {args.output}: add --resume to the same "
              "command to continue", file=sys.stderr)
        return 130
    except AttnscopeError as exc:
        raise AttnscopeError(str(exc).replace("resume=True", "--resume").replace("outdir", "-o OUTDIR"),
                             parameter=exc.parameter) from exc
    s = result.summary
    if args.format == "json":
        print_json({"output": args.output, "documents": s["documents"], "examples": s["examples"],
                    "skipped": s["skipped"], "malformed": s["source"]["malformed"], "removal": s["removal"],
                    "files": [str(f) for f in result.files]})
        return 0
    _print(s, args.output)
    return 0


def _print(s: dict[str, Any], out: str) -> None:
    print(f"{s['examples']:,} examples ({s['skipped']:,} too short, {s['source']['malformed']:,} malformed rows "
          f"skipped) on {s['model']}; removal: {s['removal']} (special tokens never removed); unperturbed check "
          f"max error {s['unperturbed_error_max']:.1e}; NAOPC bounds: {', '.join(s['naopc_bounds']) or 'none'}")
    if s.get("metrics") == "agreement":
        _print_agreement(s, out)
        return
    print(f"{'method':<24} {'NAOPC':>22} {'comp. AOPC':>11} {'suff. AOPC':>11} {'Spearman LOO':>13}")
    for name, e in s["methods"].items():
        n = e["naopc"]
        print(f"{name:<24} {n['mean']:>8.3f} [{n['low']:.3f}, {n['high']:.3f}] "
              f"{e['comprehensiveness_aopc']['mean']:>11.4f} {e['sufficiency_aopc']['mean']:>11.4f} "
              f"{e['spearman_loo']['mean']:>13.3f}")
    print(f"Files: {out}/examples.parquet, {out}/examples.json, {out}/summary.json")


def _print_agreement(s: dict[str, Any], out: str) -> None:
    """The table of a run of --metrics agreement: Spearman and Kendall with leave-one-out, 95% intervals."""
    print(f"{'method':<24} {'Spearman LOO':>24} {'Kendall LOO':>24}")
    for name, e in s["methods"].items():
        rho, tau = e["spearman_loo"], e["kendall_loo"]
        print(f"{name:<24} {rho['mean']:>8.3f} [{rho['low']:.3f}, {rho['high']:.3f}] "
              f"{tau['mean']:>8.3f} [{tau['low']:.3f}, {tau['high']:.3f}]")
    print(f"Files: {out}/examples.parquet, {out}/examples.json, {out}/summary.json")
