"""generate on an encoder-decoder model: the translation step by step, each new token's alignment over the source."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from attnscope.cli.common import console, print_json
from attnscope.errors import AttnscopeError

if TYPE_CHECKING:
    from attnscope.models import Model
    from attnscope.records.generation import GeneratedToken
    from attnscope.records.translation import Seq2SeqGeneration

COLUMNS = ("step", "pos", "token", "p", "top alternatives", "source tokens read most")
GENERATE_NOTE = ("vs generate: each step's attention rows as the model's own generate loop (KV cache) returned them, "
                 "against the teacher-forced trace's rows, which are recomputed from the weights")


def run_generate_seq2seq(m: Model, source: str, args: argparse.Namespace, figure: str | None = None) -> int:
    """Greedy translation of SOURCE, each step's alignment shown; the exit code of the worst verdict."""
    if figure:
        raise AttnscopeError(f"-o {args.output}: figures of an encoder-decoder generation are not made yet; save the "
                             "trace as FILE.safetensors or FILE.npz (or the page with --html FILE)")
    sampling = [flag for flag, v in (("--temperature", args.temperature), ("--top-k", args.top_k),
                                     ("--top-p", args.top_p), ("--seed", args.seed)) if v is not None]
    if sampling:
        raise AttnscopeError(f"{', '.join(sampling)}: generation on an encoder-decoder model ({m.name}) is greedy "
                             "here; drop the sampling flags")
    from attnscope.records.check_report import EXIT_CODES
    from attnscope.tracing.seq2seq_decoding import generate_seq2seq

    g = generate_seq2seq(source, model=m, max_new_tokens=args.max_new_tokens, alternatives=args.alternatives)
    layer = g.trace.cross.n_layers - 1 if args.layer is None else args.layer
    g.trace.cross.validate(layer=layer, head=args.head)
    if args.output:
        g.save(args.output)
    if args.html:
        from attnscope.views import HTMLPage

        # the translation view: each step's alignment over the source
        HTMLPage(g.to_html(raw_tokens=args.raw_tokens)).save(args.html)
    _emit(g, layer, args)
    return EXIT_CODES[g.status()]


def _emit(g: Seq2SeqGeneration, layer: int, args: argparse.Namespace) -> None:
    if args.format == "json":
        print_json(generation_json(g, layer, args.head))
        return
    if args.format == "markdown":
        sys.stdout.write(generation_markdown(g, layer, args.head, args.raw_tokens))
        return
    from attnscope.explain.render import check_summary

    out = console()
    out.print(header(g))
    out.print(steps_table(g, layer, args.head, args.raw_tokens))
    for kind, report in g.check().items():
        out.print(f"{kind}: {check_summary(report)}; {_generate_error(report)}")
    out.print(f"{g.status()} ({GENERATE_NOTE})")
    for path in (args.output, args.html):
        if path:
            out.print(f"wrote {path}")


def header(g: Seq2SeqGeneration) -> str:
    return (f"{g.model.get('name')} ({g.model.get('architecture')}): source {g.source!r} -> {g.completion!r} "
            f"(greedy; {g.n_steps} steps, stopped: {g.stopped}; {g.trace.encoder.n_tokens} source tokens, "
            f"{g.trace.cross.n_layers} decoder layers x {g.trace.cross.n_heads} heads)")


def _who(layer: int, head: int | None) -> str:
    return f"cross-attention of layer {layer}, " + ("mean over heads" if head is None else f"head {head}")


def _generate_error(report: Any) -> str:
    e = report.worst("weights", "generate")
    return "generate loop not compared" if e is None else f"generate loop's rows vs the trace: max error {e:.1e}"


def step_cells(g: Seq2SeqGeneration, s: GeneratedToken, layer: int, head: int | None,
               raw: bool = False, sep: str = ", ") -> list[str]:
    """A step's row; every token as the tokenizer decodes its piece (raw: as it spells it), repr-quoted; sep
    between a cell's tokens."""
    source = g.trace.encoder.tokens
    alts = sep.join(f"{a.text if raw else a.shown!r} {_p(a.probability)}" for a in s.alternatives)
    read = sep.join(f"{i}:{source[i].text if raw else source[i].shown!r} {w:.2f}"
                     for i, w in g.aligned(s.step, layer, head))
    return [str(s.step), str(s.position), repr(s.text if raw else s.shown), _p(s.probability), alts, read]


def _p(p: float) -> str:
    """A probability: 3 decimals, or 2 significant digits below 0.001 (not a misleading 0.000)."""
    return f"{p:.3f}" if p >= 1e-3 or p == 0.0 else f"{p:.1e}"


def steps_table(g: Seq2SeqGeneration, layer: int, head: int | None, raw: bool = False) -> Any:
    from attnscope.cli.common import rich_steps_table

    return rich_steps_table(f"each step (0-indexed): the new target token, its probability, the alternatives, and "
                            f"the source tokens its query reads most (the alignment; {_who(layer, head)})", COLUMNS,
                            [step_cells(g, s, layer, head, raw) for s in g.steps])


def generation_markdown(g: Seq2SeqGeneration, layer: int, head: int | None, raw: bool = False) -> str:
    from attnscope.explain.render import check_markdown

    lines = [f"**{header(g)}**", "", f"Alignment: {_who(layer, head)}.", "",
             "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in step_cells(g, s, layer, head, raw)) + " |"
              for s in g.steps]
    checks = [check_markdown(r, g.trace.attention(k).n_layers, f"**{k}**") for k, r in g.check().items()]
    return "\n".join(lines) + "\n\n" + "\n".join(checks) + f"\n{g.status()}: {GENERATE_NOTE}.\n"


def generation_json(g: Seq2SeqGeneration, layer: int, head: int | None) -> dict[str, Any]:
    steps = [{**s.to_dict(), "aligned": [{"source": i, "weight": w} for i, w in g.aligned(s.step, layer, head)],
              "alignment": g.alignment(s.step)[layer].tolist()} for s in g.steps]  # [head, source]
    return {"model": g.model, "source": g.source, "source_tokens": g.trace.encoder.token_strings,
            "completion": g.completion, "decoder_tokens": g.trace.decoder.token_strings, "settings": g.settings,
            "stopped": g.stopped, "steps": steps, "aligned_by": {"layer": layer, "head": head},
            "status": g.status(), "check": {k: r.to_dict() for k, r in g.check().items()}}
