"""How many torch threads the CLI should use: `attnscope generate` (20 tokens, SmolLM2) with 1 thread, with one
per core (torch's default, `--threads 0`) and with the default (the idle cores, from the load average), each on
a quiet machine and beside busy loops that take all but one core or every core (another job on a shared
machine). Wall-clock seconds, best of --repeat, as ratios to 1 thread under the same load in the same run.

    .venv/bin/python benchmarks/bench_threads.py [--repeat 2]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

CLI = [str(Path(sys.executable).with_name("attnscope")), "generate", "The capital of France is", "--model",
       "smollm2", "--max-new-tokens", "20", "--format", "json"]


def _spin() -> None:
    while True:
        pass


def timed(threads: str | None, repeat: int) -> float:
    extra = [] if threads is None else ["--threads", threads]
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(CLI + extra, check=True, capture_output=True)
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0))
    print(f"{cores} cores; generate 20 tokens on SmolLM2, wall seconds (best of {args.repeat})")
    print(f"{'busy loops':>10} {'1 thread':>9} {'per core':>9} {'default':>9}  per core/1  default/1")
    for busy in sorted({0, cores - 1, cores}):
        loops = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(busy)]
        for p in loops:
            p.start()
        time.sleep(65 if busy else 0)  # let the 1-minute load average see the loops
        try:
            one, per_core, default = timed("1", args.repeat), timed("0", args.repeat), timed(None, args.repeat)
        finally:
            for p in loops:
                p.terminate()
        ratios = f"{per_core / one:>10.2f} {default / one:>10.2f}"
        print(f"{busy:>10} {one:>9.1f} {per_core:>9.1f} {default:>9.1f}  {ratios}")
        time.sleep(65 if busy else 0)  # and forget them before the next row


if __name__ == "__main__":
    main()
