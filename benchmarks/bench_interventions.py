"""Interventions: batched single-head ablation against one forward and the one-by-one loop; head importance
against `stats` on the same sentences.

1. `ablate --each` on SmolLM2 at 32 tokens (text + target): the 270 single-head ablations as rows of one
   batched forward, against one plain forward of the text, and against the loop a user would write
   (one forward per head with that head's gate closed). The loop is timed on every --stride-th head and
   scaled to 270 (--stride 1 times all of them); its values are checked against the batched rows.
   Target: batched >= 5x faster than the loop.
2. `importance` (gradients only) over the first --documents UD English EWT dev sentences with the bundled
   MiniLM, against `stats` (the local engine) on the same sentences, as a ratio.
The machine is shared: every ratio is measured in the same run, best of --repeats.

Usage: .venv/bin/python benchmarks/bench_interventions.py [--documents 500] [--stride 10] [--repeats 2]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

import attnscope
from attnscope.interventions.ablate import setting_gates
from attnscope.interventions.effects import Probe, effects, outputs, prepare
from attnscope.interventions.gates import HeadEdit, ones
from attnscope.interventions.importance import ImportanceSettings, accumulate
from attnscope.stats import Settings, Source, run
from corpus import ud_dev

UD_DEV = ud_dev()


def best(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times)


def text_of(m: attnscope.Model, n_tokens: int) -> str:
    """UD sentences' words (skipping any that overshoot) until the text is n_tokens - 1 tokens; the greedy
    target makes n_tokens."""
    words: list[str] = []
    for doc in Source(str(UD_DEV)):
        for w in doc.text.split():
            n = len(m.tokenizer(" ".join([*words, w]))["input_ids"])
            if n <= n_tokens - 1:
                words.append(w)
            if n == n_tokens - 1:
                return " ".join(words)
    raise SystemExit("the corpus is too short")


def ablation(repeats: int, stride: int) -> None:
    m = attnscope.load_model("smollm2")
    probe: Probe = prepare(m, text_of(m, 32))
    n_heads = m.n_layers * m.n_heads
    scale = setting_gates(m, [], each=True)  # [layer, 1 + 270, head]
    edit = HeadEdit(m.n_layers, scale)
    with torch.no_grad():
        one = best(lambda: outputs(probe, probe.rows(1), None), repeats)
        batched_fx: dict[str, object] = {}
        batched = best(lambda: batched_fx.update(effects(probe.kind, outputs(probe, probe.rows(1 + n_heads), edit))),
                       repeats)
        chosen = list(range(0, n_heads, stride))
        loop_values = []
        started = time.perf_counter()
        for i in chosen:
            gates = ones(m, 1)
            gates[i // m.n_heads, 0, i % m.n_heads] = 0.0
            loop_values.append(float(outputs(probe, probe.rows(1), HeadEdit(m.n_layers, gates))["target_logprob"][0]))
        loop = (time.perf_counter() - started) * n_heads / len(chosen)
    rows = batched_fx["target_logprob"]
    worst = max(abs(float(rows[1 + i]) - v) for i, v in zip(chosen, loop_values, strict=True))  # type: ignore[index]
    print(f"ablate --each on SmolLM2, {probe.n_tokens} tokens, {n_heads} heads (target {probe.target!r}):")
    print(f"  one forward                   {one * 1e3:8.0f} ms")
    print(f"  batched, {n_heads} ablations      {batched * 1e3:8.0f} ms  ({batched / one:.1f} forwards)")
    print(f"  one by one (timed {len(chosen)}, x{n_heads / len(chosen):.0f}) {loop * 1e3:8.0f} ms")
    print(f"  batched is {loop / batched:.1f}x faster than one by one (target >= 5x); "
          f"max |batched - loop| of the target log-prob {worst:.1e}")
    # the loop is timed minutes after the one forward: on a shared machine the load may change in between
    print(f"  ({n_heads} forwards at the one-forward time would be {n_heads * one / batched:.1f}x the batched run)")


def importance_vs_stats(documents: int, repeats: int) -> None:
    m = attnscope.load_model()
    texts = [d.text for _, d in zip(range(documents), Source(str(UD_DEV)), strict=False)]
    settings = ImportanceSettings(batch_size=8, max_length=128, limit=documents)

    def importance_run() -> None:
        with tempfile.TemporaryDirectory() as out:
            accumulate(m, texts, Path(out) / "imp", {"spec": str(UD_DEV)}, settings)

    def stats_run() -> None:
        with tempfile.TemporaryDirectory() as out:
            run(Source(str(UD_DEV)), m, Settings(max_length=128, limit=documents), Path(out) / "stats")

    t_stats, t_imp = best(stats_run, repeats), best(importance_run, 1)
    print(f"importance (gradients) over {documents} UD sentences with {m.name}: {t_imp:.1f} s; "
          f"stats on the same sentences {t_stats:.1f} s; importance / stats = {t_imp / t_stats:.1f}x "
          f"(an encoder needs one forward-mode row per head: {m.n_layers * m.n_heads} per sentence)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--documents", type=int, default=500)
    ap.add_argument("--stride", type=int, default=10, help="time every N-th head in the one-by-one loop")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--skip-importance", action="store_true")
    args = ap.parse_args()
    ablation(args.repeats, args.stride)
    if not args.skip_importance:
        importance_vs_stats(args.documents, args.repeats)


if __name__ == "__main__":
    main()
