"""What each attribution method costs: SmolLM2 at 32 tokens and MiniLM at 128 tokens.

Per method: its wall time in units of one forward pass of the same input (no gradients), the forwards and
backwards it runs (one sequence each: a batch of 8 counts 8), and the ratio of its time to the time those
passes take one by one, measured in the same run (target <= 1.5x: batching should bring it under 1). A backward
costs (forward + backward) - forward, both medians of --repeat unbatched runs. Flow's max-flows are not passes
(its ratio is left out). The attention-based methods' one forward is the verified trace's, whose recompute and
check cost more than a forward. Ratios only: no absolute assertion, the machine is shared.

    .venv/bin/python benchmarks/bench_attribute.py [--threads 1] [--repeat 3] [--ig-steps 64] [--only minilm]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

import attnscope
from attnscope.attribution.api import attribute_objective, make_settings
from attnscope.attribution.methods import METHODS
from attnscope.attribution.objective import Objective, build_objective

TEXT = ("The capital of France is Paris, and the capital of Italy is Rome; travellers between the two cities "
        "often take the night train through the Alps, which crosses the border near Modane before dawn. ") * 4
CASES = {"smollm2": ("smollm2", 32), "minilm": ("minilm", 128)}


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


def bench(case: str, repeat: int, ig_steps: int) -> None:
    name, n = CASES[case]
    m = attnscope.load_model(name)
    obj = build_objective(m, TEXT, max_length=n)
    t_f, t_b = pass_times(obj, repeat)
    print(f"\n{m.name}: {obj.n_tokens} tokens, {obj.description[:70]}...")
    print(f"one forward {t_f * 1e3:.1f} ms, one backward {t_b * 1e3:.1f} ms (medians of {repeat})")
    print(f"{'method':24} {'seconds':>8} {'x forward':>9} {'F':>5} {'B':>5} {'ratio':>6}  check")
    settings = make_settings(ig_steps=ig_steps, ig_max_steps=ig_steps, max_flow_tokens=n)
    for method in METHODS.values():
        if method.supports(obj) is not None:
            continue
        a = attribute_objective(obj, [method.name], settings)
        ms = a.methods[method.name]
        passes = ms.cost.forwards * t_f + ms.cost.backwards * t_b
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
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    import captum.attr  # noqa: F401  # imported once before timing: the first method to use it would pay ~1 s
    for case in [args.only] if args.only else list(CASES):
        bench(case, args.repeat, args.ig_steps)


if __name__ == "__main__":
    main()
