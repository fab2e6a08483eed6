"""What each attribution method costs: SmolLM2 at 32 tokens and MiniLM at 128 tokens.

Per method: its wall time in units of one forward pass of the same input (no gradients; the median of --repeat runs
for a method under 20 forwards, else one run), the forwards and backwards it runs (one sequence each: a batch of 8
counts 8), and the ratio of its time to the time those passes take one by one, measured in the same run (target <=
1.5x: batching should bring it under 1). A backward costs (forward + backward) - forward, both medians of --repeat
unbatched runs. Flow's max-flows are not passes (its ratio is left out). The attention-based methods read the
verified trace (attention.shared_trace): the forward they need IS the verified trace (one forward with every stage
kept, then each stage recomputed and checked), so their ratio is to that trace's own time (trace_of + trace_check,
median of --repeat), plus one forward and T backwards for attention x gradient's own gradient pass. Ratios only: no
absolute assertion, the machine is shared.

    .venv/bin/python benchmarks/bench_attribute.py [--threads 1] [--repeat 3] [--ig-steps 64] [--only minilm]
        [--methods alti,norm]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

import attnscope
from attnscope.attribution.api import attribute_objective, make_settings
from attnscope.attribution.attention import trace_check, trace_of
from attnscope.attribution.methods import METHODS, Settings
from attnscope.attribution.objective import Objective, build_objective
from attnscope.attribution.record import MethodScores

TEXT = ("The capital of France is Paris, and the capital of Italy is Rome; travellers between the two cities "
        "often take the night train through the Alps, which crosses the border near Modane before dawn. ") * 4
CASES = {"smollm2": ("smollm2", 32), "minilm": ("minilm", 128)}
ON_TRACE = {"attention", "rollout", "flow", "attention_x_gradient"}  # their first forward is the verified trace


def median_seconds(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def pass_times(obj: Objective, repeat: int) -> tuple[float, float]:
    """(one forward, one backward) of the objective's input, unbatched, in seconds."""
    with torch.no_grad():
        embeds = obj.embed(obj.ids[None])

    def forward() -> None:
        with torch.no_grad():
            obj.score_embeds(embeds)

    def forward_backward() -> None:
        e = embeds.clone().requires_grad_(True)
        obj.score_embeds(e)[0, 0].backward()  # type: ignore[no-untyped-call]

    forward()  # warm up
    t_f = median_seconds(forward, repeat)
    return t_f, max(0.0, median_seconds(forward_backward, repeat) - t_f)


def trace_seconds(obj: Objective, repeat: int) -> float:
    """The verified trace of the objective's input: traced, then every stage recomputed and checked."""
    return median_seconds(lambda: trace_check(trace_of(obj)), repeat)


def method_scores(obj: Objective, name: str, settings: Settings, repeat: int, cheap: float) -> MethodScores:
    """One method's scores, its seconds the median of `repeat` runs when one run takes under `cheap` seconds (the
    passes it is compared with are medians too), else of the one run."""
    runs = [attribute_objective(obj, [name], settings).methods[name]]
    if runs[0].cost.seconds < cheap:
        runs += [attribute_objective(obj, [name], settings).methods[name] for _ in range(repeat - 1)]
    runs.sort(key=lambda ms: ms.cost.seconds)
    return runs[len(runs) // 2]


def bench(case: str, repeat: int, ig_steps: int, only: list[str] | None) -> None:
    name, n = CASES[case]
    m = attnscope.load_model(name)
    obj = build_objective(m, TEXT, max_length=n)
    t_f, t_b = pass_times(obj, repeat)
    t_trace = trace_seconds(obj, repeat)
    print(f"\n{m.name}: {obj.n_tokens} tokens, {obj.description[:70]}...")
    print(f"one forward {t_f * 1e3:.1f} ms, one backward {t_b * 1e3:.1f} ms, the verified trace {t_trace * 1e3:.1f} ms "
          f"(medians of {repeat})")
    print(f"{'method':24} {'seconds':>8} {'x forward':>9} {'F':>5} {'B':>5} {'ratio':>6}  check")
    settings = make_settings(ig_steps=ig_steps, ig_max_steps=ig_steps, max_flow_tokens=n)
    for method in METHODS.values():
        if method.supports(obj) is not None or (only and method.name not in only):
            continue
        ms = method_scores(obj, method.name, settings, repeat, cheap=20 * t_f)
        first = t_trace if method.name in ON_TRACE else t_f  # the one forward every method runs first
        passes = first + (ms.cost.forwards - 1) * t_f + ms.cost.backwards * t_b
        ratio = "n/a" if method.name == "flow" else f"{ms.cost.seconds / passes:.2f}"
        print(f"{method.name:24} {ms.cost.seconds:8.2f} {ms.cost.seconds / t_f:9.1f} {ms.cost.forwards:5d} "
              f"{ms.cost.backwards:5d} {ratio:>6}  {ms.check.status} {ms.check.value:.2g}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--ig-steps", type=int, default=64,
                        help="integrated gradients at this many steps, no doubling (the cost per step is the point)")
    parser.add_argument("--only", choices=sorted(CASES), default=None)
    parser.add_argument("--methods", default=None,
                        help="comma-separated method names (default: every one that applies)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    import captum.attr  # noqa: F401  # imported once before timing: the first method to use it would pay ~1 s
    only = args.methods.split(",") if args.methods else None
    for case in [args.only] if args.only else list(CASES):
        bench(case, args.repeat, args.ig_steps, only)


if __name__ == "__main__":
    main()
