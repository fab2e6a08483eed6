"""generate: watch a decoder write, one token at a time; and explain --step N on a generation."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

import numpy as np

from attnscope.cli.common import (
    MAX_TEXT_MB,
    add_format,
    console,
    emit_walkthrough,
    integer,
    print_json,
    read_text,
    real,
    rich_steps_table,
)

if TYPE_CHECKING:
    from attnscope.records.generation import GeneratedToken, GenerationTrace

# Heavy imports (torch, transformers) happen inside the commands, so --help and input errors are instant.
DEFAULT_GENERATOR = "smollm2"


def register(sub: Any) -> None:
    p = sub.add_parser("generate", help="generate text one token at a time, every step's attention verified")
    p.add_argument("text", nargs="?", metavar="PROMPT",
                   help="the prompt to continue (an encoder-decoder model: the source to translate)")
    p.add_argument("--text-file", metavar="PATH", help="read PROMPT from a UTF-8 file instead")
    p.add_argument("--max-text-mb", type=real, default=MAX_TEXT_MB, metavar="MB",
                   help=f"refuse a --text-file larger than this (default {MAX_TEXT_MB})")
    p.add_argument("--model", metavar="M", default=DEFAULT_GENERATOR,
                   help=f"a causal LM, or an encoder-decoder (T5, BART, Marian: greedy, each step's alignment over "
                        f"the source): Hugging Face id or local checkpoint (default {DEFAULT_GENERATOR})")
    p.add_argument("--max-new-tokens", type=integer, default=20, metavar="N", help="at most N new tokens (default 20)")
    p.add_argument("--temperature", type=real, default=None, metavar="T", help="sample at temperature T")
    p.add_argument("--top-k", type=integer, default=None, metavar="K", help="sample from the K most likely tokens")
    p.add_argument("--top-p", type=real, default=None, metavar="P", help="sample from the top-P probability mass")
    p.add_argument("--seed", type=integer, default=None, metavar="S", help="seed for sampling (repeatable runs)")
    p.add_argument("--layer", type=integer, default=None, metavar="L",
                   help="layer for the most attended tokens, 0-indexed (default: the last)")
    p.add_argument("--head", type=integer, default=None, metavar="H",
                   help="one head for the most attended tokens, 0-indexed (default: mean over heads)")
    p.add_argument("--alternatives", type=integer, default=3, metavar="K", help="top alternatives shown per step")
    p.add_argument("-o", "--output", metavar="FILE", help="save the generation trace: FILE.safetensors or FILE.npz; "
                   "or one step of the generation view as a figure: FILE.svg, FILE.png or FILE.pdf")
    p.add_argument("--step", type=integer, default=None, metavar="N",
                   help="the step a figure shows, 0-indexed (default: the last); its layer and head: --layer, --head")
    p.add_argument("--scale", type=real, default=2.0, help="png figure: pixels per SVG pixel (default 2)")
    p.add_argument("--html", metavar="FILE", help="write the generation view (a self-contained page)")
    p.add_argument("--raw-tokens", action="store_true",
                   help="show tokens as the tokenizer spells its pieces, with byte-level marks (GPT-2's 'Ġ' for a "
                        "space, 'Ċ' for a newline) in the tables, the page and the figure; by default each reads as "
                        "the tokenizer decodes it")
    add_format(p)
    p.set_defaults(func=run_generate)


def add_step_args(p: argparse.ArgumentParser) -> None:
    """explain's options for one generated step."""
    p.add_argument("--step", type=integer, default=None, metavar="N",
                   help="explain generation step N (0-indexed) of TEXT as a prompt, or of --generation FILE; "
                        f"without --model, TEXT is continued by {DEFAULT_GENERATOR} (a decoder: MiniLM cannot write)")
    p.add_argument("--generation", metavar="FILE", default=None, help="a generation saved by `generate -o FILE`")


def run_generate(args: argparse.Namespace) -> int:
    from attnscope.errors import AttnscopeError, require_text

    prompt = require_text(read_text(args), "prompt")
    from attnscope.tracing.decoding import GenerationInterrupted, generate, validate_settings

    validate_settings(args.max_new_tokens, args.temperature, args.top_k, args.top_p, args.alternatives, args.seed)
    figure = _figure_format(args)
    from attnscope import families
    from attnscope.models import load_model

    m = load_model(args.model)
    if families.is_encoder_decoder(m.model):
        from attnscope.cli.generate_seq2seq import run_generate_seq2seq

        return run_generate_seq2seq(m, prompt, args, figure)
    _require_before_streaming(m, args)
    stream = args.format == "text"
    if stream:
        sys.stdout.write(prompt)
        sys.stdout.flush()
    status = 0
    try:
        g = generate(prompt, model=args.model, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                     top_k=args.top_k, top_p=args.top_p, seed=args.seed, alternatives=args.alternatives,
                     on_token=_echo if stream else None)
    except GenerationInterrupted as exc:
        if exc.partial is None:
            raise KeyboardInterrupt from exc
        g, status = exc.partial, 130
        print(f"\nattnscope: interrupted: keeping the {g.n_steps} steps generated so far", file=sys.stderr)
    except AttnscopeError:
        if stream:  # the error's one line after the text streamed so far, not inside it
            sys.stdout.write("\n")
            sys.stdout.flush()
        raise
    if args.output and figure:
        from attnscope.views.generation import generation_figure

        generation_figure(g, args.output, step=args.step, layer=args.layer, head=args.head, scale=args.scale,
                          raw_tokens=args.raw_tokens)
    elif args.output:
        g.save(args.output)
    if args.html:
        g.show(raw_tokens=args.raw_tokens).save(args.html)
    _emit(g, args)
    return status if status else (0 if g.check().ok else 1)


def _require_before_streaming(m: Any, args: argparse.Namespace) -> None:
    """What generate would refuse after the prompt was printed: refused first, so its one line stands alone."""
    from attnscope.errors import validate_index
    from attnscope.tracing.decoding import require_decoder

    require_decoder(m)
    if args.layer is not None:
        validate_index("layer", args.layer, m.n_layers)
    if args.head is not None:
        validate_index("head", args.head, m.n_heads)


def _figure_format(args: argparse.Namespace) -> str | None:
    """svg, png or pdf when -o names a figure (checked before generating), else None (a saved trace)."""
    from pathlib import Path

    from attnscope.errors import AttnscopeError
    from attnscope.views.figures import FORMATS, MAX_SCALE

    kind = Path(args.output).suffix.lower().lstrip(".") if args.output else ""
    if args.output and kind not in (*FORMATS, "safetensors", "npz"):
        raise AttnscopeError(f"unsupported output format {kind or Path(args.output).name!r}: name the output "
                             "FILE.safetensors or FILE.npz (the trace), or FILE.svg, FILE.png or FILE.pdf (a figure)")
    if kind not in FORMATS:
        if args.step is not None:
            raise AttnscopeError("--step chooses the step of a figure: name the output FILE.svg, FILE.png or FILE.pdf")
        return None
    if not 0 < args.scale <= MAX_SCALE:
        raise AttnscopeError(f"--scale must be above 0 and at most {MAX_SCALE:g}, got {args.scale:g}")
    if args.step is not None and not 0 <= args.step < args.max_new_tokens:
        raise AttnscopeError(f"--step {args.step} is outside the {args.max_new_tokens} steps of --max-new-tokens "
                             "(0-indexed)")
    return kind


def _echo(step: GeneratedToken) -> None:
    sys.stdout.write(step.piece)
    sys.stdout.flush()


def _emit(g: GenerationTrace, args: argparse.Namespace) -> None:
    layer = g.trace.n_layers - 1 if args.layer is None else args.layer
    g.trace.validate(layer=layer, head=args.head)
    if args.format == "json":
        print_json(generation_json(g, layer, args.head))
    elif args.format == "markdown":
        sys.stdout.write(generation_markdown(g, layer, args.head, args.raw_tokens))
    else:
        from attnscope.explain.render import check_summary

        out = console()
        out.print()
        out.print(_header(g))
        out.print(steps_table(g, layer, args.head, args.raw_tokens))
        out.print(check_overview(g))
        out.print(check_summary(g.check()))
        for path in (args.output, args.html):
            if path:
                out.print(f"wrote {path}")


def _header(g: GenerationTrace) -> str:
    how = "greedy" if not g.settings.get("do_sample") else "sampled"
    return (f"{g.model.get('name')} ({g.model.get('architecture')}): {g.prompt_length} prompt tokens, "
            f"{g.n_steps} new ({how}; stopped: {g.stopped}); {g.trace.n_layers} layers x {g.trace.n_heads} heads")


def _who(g: GenerationTrace, layer: int, head: int | None) -> str:
    return f"layer {layer}, " + ("mean over heads" if head is None else f"head {head}")


def _step_cells(g: GenerationTrace, s: GeneratedToken, layer: int, head: int | None, raw: bool = False,
                sep: str = ", ") -> list[str]:
    """A step's row; every token as the tokenizer decodes its piece (raw: as it spells it), repr-quoted so that
    spaces and newlines show; sep between a cell's tokens ("\n" in the terminal: a token never wraps at its space)."""
    tokens = g.tokens
    alts = sep.join(f"{a.text if raw else a.shown!r} {a.probability:.3f}" for a in s.alternatives)
    seen = sep.join(f"{i}:{tokens[i].text if raw else tokens[i].shown!r} {w:.2f}"
                     for i, w in g.attended(s.step, layer, head))
    return [str(s.step), str(s.position), repr(s.text if raw else s.shown), f"{s.probability:.3f}", alts, seen]


_COLUMNS = ("step", "pos", "token", "p", "top alternatives", "most attended")


def steps_table(g: GenerationTrace, layer: int, head: int | None, raw: bool = False) -> Any:
    return rich_steps_table(f"each step (0-indexed): the token, its probability, the alternatives, and the earlier "
                            f"tokens its query attends to most ({_who(g, layer, head)})", _COLUMNS,
                            [_step_cells(g, s, layer, head, raw, "\n") for s in g.steps])


MEASURE = ("errors are |a - b| / max(1, largest |b| of the row): absolute for rows of numbers up to 1 (every "
           "weight row), relative to the row's scale above; no-cache q, k, v, context and output relative to the "
           "size of their sums' terms (|x| |W[:, j]|; max |v| read; |merged| |W_O[:, j]|), which the two passes add "
           "in other orders")


def check_overview(g: GenerationTrace) -> Any:
    """One line per stage and comparison: the max error and where it is (layers and heads 0-indexed)."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    t = Table()
    for name in ("stage", "vs", "max error", "at"):
        t.add_column(name, justify="right" if name == "max error" else "left")
    report = g.check()
    for c in report.comparisons:
        worst = 0 if np.isnan(c.errors).all() else int(np.nanargmax(c.errors))
        layer, head = (int(i) for i in np.unravel_index(worst, c.errors.shape))
        style = "green" if c.max_error <= report.tolerance else "bold red"
        where = f"layer {layer}" + (f", head {head}" if c.errors.shape[1] > 1 else "")
        t.add_row(c.stage, c.source, f"[{style}]{c.max_error:.1e}[/{style}]", where)
    # the title and the legend wrap to the terminal, not to the narrow table
    title = Text("every step recomputed from the layer's weights with the cached keys and values (recompute), and "
                 "every row against one forward pass without a cache (no-cache)")
    return Group(title, t, Text(MEASURE))


def generation_markdown(g: GenerationTrace, layer: int, head: int | None, raw: bool = False) -> str:
    from attnscope.explain.render import check_markdown

    lines = [f"**{_header(g)}**", "", f"> {g.prompt}**{g.completion}**".replace("\n", " "), "",
             f"Most attended: {_who(g, layer, head)}.", "",
             "| " + " | ".join(_COLUMNS) + " |", "|" + "---|" * len(_COLUMNS)]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in _step_cells(g, s, layer, head, raw)) + " |"
              for s in g.steps]
    return "\n".join(lines) + "\n\n" + check_markdown(g.check(), g.trace.n_layers) + f"\n{MEASURE}.\n"


def generation_json(g: GenerationTrace, layer: int, head: int | None) -> dict[str, Any]:
    steps = [{**s.to_dict(), "attended": [{"position": i, "weight": w} for i, w in g.attended(s.step, layer, head)]}
             for s in g.steps]
    return {"model": g.model, **g.metadata(), "steps": steps, "attended_by": {"layer": layer, "head": head},
            "check": g.check().to_dict()}


def run_explain_step(args: argparse.Namespace) -> int:
    """explain --step N: one generated step, its cached keys and values shown as the cache."""
    from attnscope.explain.from_trace import walkthrough
    from attnscope.models import load_model
    from attnscope.records.generation import load_generation

    if args.step is None:
        raise_error("--generation FILE explains one step: give --step N too")
    if args.step < 0:
        raise_error(f"--step {args.step} is out of range: steps are counted from 0")
    if args.generation is not None:
        if args.text is not None or args.text_file:
            raise_error("give TEXT or --generation FILE, not both")
        g = load_generation(args.generation)
        model = load_model(args.model or g.model.get("name"))
    else:
        from attnscope.errors import require_text
        from attnscope.tracing.decoding import generate

        prompt = require_text(read_text(args), "prompt")
        model = load_model(args.model or DEFAULT_GENERATOR)
        g = generate(prompt, model=model, max_new_tokens=max(1, args.step + 1))
    g.validate_step(args.step)
    pos = g.query_position(args.step)
    w = walkthrough(g.step_trace(args.step), args.layer, args.head, pos, model=model)
    w.steps.insert(1, cache_step(g, args.step, args.layer, args.head))
    emit_walkthrough(w, args.format)
    return 0


def cache_step(g: GenerationTrace, step: int, layer: int, head: int) -> Any:
    """The walkthrough's step that shows the KV cache the step's query read, and the row it added."""
    from attnscope.explain.steps import Step

    pos = g.query_position(step)
    kv = g.trace.kv_head(head)  # grouped-query attention: the k/v head this query head reads
    k, v = g.trace.arrays["k"][layer, kv, : pos + 1], g.trace.arrays["v"][layer, kv, : pos + 1]  # [key, d_head]
    tokens = g.tokens
    labels = [f"{i}:{tokens[i].text} ({'cache' if i < pos else 'new'})" for i in range(pos + 1)]
    nxt = g.steps[step]
    made = "the prompt's forward pass (the prefill)" if step == 0 else f"step {step - 1}"
    text = (f"Step {step} writes token {nxt.position} ({nxt.text!r}, p = {nxt.probability:.3f}). Its query is the "
            f"last token so far, position {pos}, made by {made}. With a KV cache the model does not recompute "
            f"the keys and values of positions 0..{pos - 1}: it reads them from the cache (rows marked cache) "
            f"and computes only row {pos} (marked new). Below: the whole sequence up to position {pos}; the "
            f"rows for query {pos} are this step's attention.")
    whose = f"head {head}"
    if g.trace.kv_heads != g.trace.n_heads:  # grouped-query attention
        text += (f" Query heads share k/v heads ({g.trace.n_heads} read {g.trace.kv_heads}): the cache holds one k "
                 f"and one v per k/v head, and head {head} reads k/v head {kv}'s.")
        whose = f"k/v head {kv} (read by head {head})"
    return Step("cache", f"The KV cache of layer {layer}, {whose}", text,
                f"[key, d_head] = [{pos + 1}, {k.shape[-1]}]", {"k (cache + new)": k, "v (cache + new)": v},
                row_labels=labels)


def raise_error(message: str) -> None:
    from attnscope.errors import AttnscopeError

    raise AttnscopeError(message)
