"""What each attribution method costs: SmolLM2 at 32 tokens and MiniLM at 128 tokens.

Per method: its wall time in units of one forward pass of the same input (no gradients; for a method under 20
forwards, the median of --repeat runs after a first one that warms up, each run just after one timed forward; else
one run), the forwards and backwards it runs (one sequence each: a batch of 8 counts 8), and the ratio of its time
to the time those passes take one by one, measured in the same run (target <= 1.5x: batching should bring it under
1); a repeated method's forward is the median of the forwards timed in pairs with its runs (the load drifts on a
shared machine). A backward costs (forward + backward) - forward, both medians of --repeat
unbatched runs. Flow's max-flows are not passes (its ratio is left out). The attention-based methods read the
verified trace (attention.shared_trace): the forward they need IS the verified trace (one forward with every stage
kept, then each stage recomputed and checked), so their ratio is to that trace's own time (trace_of + trace_check,
median of --repeat), plus one forward and T backwards for attention x gradient's own gradient pass. Ratios only: no
absolute assertion, the machine is shared.

    .venv/bin/python benchmarks/bench_attribute.py [--threads 1] [--repeat 3] [--ig-steps 64] [--only minilm]
        [--methods alti,norm] [--alti-steps]

--alti-steps: after ALTI's row, where its time goes, per layer (medians of --repeat x layers): each step of
alti.layer_alti timed alone, on each block as the forward pass hands it over, and the capture beside one forward.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from collections.abc import Callable, Iterator

import numpy as np
import torch

import attnscope
from attnscope.attribution import alti as alti_module
from attnscope.attribution import alti_kernel
from attnscope.attribution.api import attribute_objective, make_settings
from attnscope.attribution.attention import trace_check, trace_of
from attnscope.attribution.blocks import LayerBlock, map_blocks
from attnscope.attribution.methods import METHODS, Settings
from attnscope.attribution.objective import Objective, build_objective
from attnscope.attribution.record import MethodScores

TEXT = ("The capital of France is Paris, and the capital of Italy is Rome; travellers between the two cities "
        "often take the night train through the Alps, which crosses the border near Modane before dawn. ") * 4
CASES = {"smollm2": ("smollm2", 32), "minilm": ("minilm", 128)}
ON_TRACE = {"attention", "rollout", "flow", "attention_x_gradient"}  # their first forward is the verified trace


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}  # cpu: this process's CPU time (one thread)
clock = time.perf_counter


def timed(fn: Callable[[], object]) -> float:
    start = clock()
    fn()
    return clock() - start


def median_seconds(fn: Callable[[], object], repeat: int) -> float:
    return statistics.median(timed(fn) for _ in range(repeat))


def pass_times(obj: Objective, repeat: int, backward: bool = True) -> tuple[float, float]:
    """(one forward, one backward) of the objective's input, unbatched, in seconds (backward=False: 0.0 for it)."""
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
    return t_f, max(0.0, median_seconds(forward_backward, repeat) - t_f) if backward else 0.0


def trace_seconds(obj: Objective, repeat: int) -> float:
    """The verified trace of the objective's input: traced, then every stage recomputed and checked."""
    return median_seconds(lambda: trace_check(trace_of(obj)), repeat)


def method_seconds(obj: Objective, name: str, settings: Settings, repeat: int,
                   cheap: float) -> tuple[MethodScores, float, float | None]:
    """One method's scores and seconds, and the seconds of one forward timed in pairs with it: when a first run
    (it warms up) takes under `cheap` seconds, `repeat` more runs each just after one forward of the same input (the
    medians of both: the method and the pass it is compared with under the same load, which drifts on a shared
    machine), else that one run (and None: the forward timed before it stands)."""
    out: list[MethodScores] = []
    with torch.no_grad():
        embeds = obj.embed(obj.ids[None])

    def forward() -> None:
        with torch.no_grad():
            obj.score_embeds(embeds)

    seconds = [timed(lambda: out.append(attribute_objective(obj, [name], settings).methods[name]))]
    if seconds[0] >= cheap:
        return out[0], seconds[0], None
    forwards = []
    for _ in range(repeat):
        forwards.append(timed(forward))
        seconds.append(timed(lambda: out.append(attribute_objective(obj, [name], settings).methods[name])))
    return out[0], statistics.median(seconds[1:]), statistics.median(forwards)


def bench(case: str, repeat: int, ig_steps: int, only: list[str] | None, alti_steps: bool = False) -> None:
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
        t_f = pass_times(obj, repeat, backward=False)[0]  # again just before: the load drifts during a run
        first = trace_seconds(obj, repeat) if method.name in ON_TRACE else t_f  # the one forward every method runs
        if method.name == "alti":  # numba compiles ALTI's kernels at their first use in a process without its cache
            attribute_objective(obj, [method.name], settings)  # (~10 s; on disk after): not the method's cost
        ms, seconds, paired = method_seconds(obj, method.name, settings, repeat, cheap=20 * t_f)
        if paired is not None and method.name not in ON_TRACE:
            first = t_f = paired  # the forward timed in pairs with the method's runs
        passes = first + (ms.cost.forwards - 1) * t_f + ms.cost.backwards * t_b
        ratio = "n/a" if method.name == "flow" else f"{seconds / passes:.2f}"
        print(f"{method.name:24} {seconds:8.2f} {seconds / t_f:9.1f} {ms.cost.forwards:5d} "
              f"{ms.cost.backwards:5d} {ratio:>6}  {ms.check.status} {ms.check.value:.2g}")
        if method.name == "alti":
            vectors, rest = alti_share(obj)
            print(f"{'':24} (its transformed vectors alone: {vectors:.2f} of a forward's multiply-adds, formed and "
                  f"summed in registers by one numba kernel, which sums them for the check too; the head vectors: "
                  f"{rest:.2f} more)")
            if alti_steps:
                print(alti_breakdown(obj, repeat))


COMPARED = "(layer_alti, compared)"


def alti_breakdown(obj: Objective, repeat: int) -> str:
    """alti.layer_alti's steps one by one, each timed alone on every layer's block as alti() takes it, inside the
    forward pass (blocks.map_blocks; ms, medians), the same calls in the same order as layer_alti; then the capture
    (that forward pass less the steps' time) against one forward (medians of repeat, paired)."""
    m, inputs = obj.model, obj.inputs()
    steps: dict[str, list[float]] = {}

    @contextlib.contextmanager
    def step(name: str) -> Iterator[None]:
        start = clock()
        yield
        steps.setdefault(name, []).append(clock() - start)

    into: torch.Tensor | None = None  # f's buffer, made at the first layer as alti() makes it

    def one(block: LayerBlock) -> tuple[np.ndarray, np.ndarray]:  # layer_alti's steps, each timed
        nonlocal into
        if into is None:
            into = alti_module.f_buffer(block)
        with step("the norm's rewrite (kernel_parts)"):
            p = alti_module.kernel_parts(block)
        alpha, v, w, diagonal = p.alpha.float(), p.v.float(), p.w.float(), p.diagonal.float()
        scale = None if p.scale is None else p.scale.float()
        with step("head vectors f = v W'"):
            f = alti_module.kernel_f(v, w, into)
        with step("kernel (distances and the check's sum)"):
            results = alti_kernel.run(alpha, f, diagonal, p.resultant.float(), scale)
        with step("finish (contributions and the check)"):
            matrix, _ = alti_kernel.finished(*results, p.resultant.float(), p.bias.float())
        with step(COMPARED):  # the same steps as layer_alti's, or this measures others (left out of the report)
            theirs = alti_module.layer_alti(block)[0]
        return matrix, theirs

    with torch.no_grad():
        forwards, captures = [], []
        for _ in range(repeat + 1):
            forwards.append(timed(lambda: m.model(**inputs)))
            into = None  # a new buffer each run, as each alti() call makes one
            before = {name: sum(times) for name, times in steps.items()}
            start = clock()
            pairs = map_blocks(m, inputs, True, one, torch.float32)  # as alti() runs: each layer in the forward
            spent = sum(sum(times) - before.get(name, 0.0) for name, times in steps.items())
            captures.append(clock() - start - spent)
            if not all(np.array_equal(mine, theirs) for mine, theirs in pairs):
                raise SystemExit("alti_breakdown no longer runs layer_alti's steps: update it beside alti.py")
    t_f = statistics.median(forwards[1:])
    steps.pop(COMPARED)
    lines = [f"{'':24} per layer, ms (and x forward for all {m.n_layers} layers); the capture (the forward pass "
             f"the steps run inside, less their time) "
             f"{statistics.median(captures[1:]) / t_f:.2f}x the forward ({t_f * 1e3:.1f} ms):"]
    for name, times in steps.items():
        ms = statistics.median(times[m.n_layers:])  # the first capture's layers warm up
        lines.append(f"{'':26}{name:30} {ms * 1e3:6.3f} ms  {m.n_layers * ms / t_f:.3f}x")
    return "\n".join(lines)


def alti_share(obj: Objective) -> tuple[float, float]:
    """ALTI's multiply-adds beside its one forward, as fractions of the forward pass's (every linear layer's weights
    x tokens, plus 2 tokens^2 d_model per layer for q k^T and weights v): the transformed vectors (tokens^2 x heads x
    d_model per layer, the T_i(x_j) in the distance kernel, which also sums them for the check), then the head
    vectors f = v W_O (tokens x d_model^2). The part no batching removes."""
    m, n = obj.model, obj.n_tokens
    config = getattr(m.model.config, "text_config", None) or m.model.config
    heads, d = int(config.num_attention_heads), int(config.hidden_size)
    linear = sum(mod.weight.numel() for mod in m.model.modules() if isinstance(mod, torch.nn.Linear))
    forward = linear * n + m.n_layers * 2 * n * n * d
    rest = m.n_layers * n * d * d
    return m.n_layers * n * n * heads * d / forward, rest / forward


def blas_threads(n: int) -> None:
    """numpy's BLAS on n threads too (rollout products, LayerMixing.rolled): its own pool spins on a busy machine
    (a 128 x 128 float64 product took 14 ms wall with two threads, 0.26 ms with one, under load 13)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        print("threadpoolctl is not installed: numpy's BLAS keeps its own threads (set OPENBLAS_NUM_THREADS)")
        return
    threadpool_limits(n)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--ig-steps", type=int, default=64,
                        help="integrated gradients at this many steps, no doubling (the cost per step is the point)")
    parser.add_argument("--only", choices=sorted(CASES), default=None)
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                        help="wall time, or this process's CPU time (steadier on a shared machine, one thread)")
    parser.add_argument("--methods", default=None,
                        help="comma-separated method names (default: every one that applies)")
    parser.add_argument("--alti-steps", action="store_true",
                        help="after ALTI's row, where its time goes per layer (alti.layer_alti's steps)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    blas_threads(args.threads)
    global clock
    clock = CLOCKS[args.clock]
    import captum.attr  # noqa: F401  # imported once before timing: the first method to use it would pay ~1 s
    only = args.methods.split(",") if args.methods else None
    for case in [args.only] if args.only else list(CASES):
        bench(case, args.repeat, args.ig_steps, only, args.alti_steps)


if __name__ == "__main__":
    main()
