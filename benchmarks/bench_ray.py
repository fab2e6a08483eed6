"""Corpus statistics on Ray: tokens/s of the local engine and of Ray with 1 and 2 workers.

On the first 1,000 sentences of the UD English EWT dev set, with the bundled MiniLM, the same
Settings everywhere. Each model process (the local engine, each Ray worker) gets the same torch
threads (--threads, default 1: on a shared 2-core machine two busy torch threads per process
slow a run down many times, which would swamp what is measured here).

  local   attnscope.stats.run in this process
  ray:N   attnscope.stats.distributed.run with N workers on a local Ray runtime (started once)

tokens/s is the run's own clock (result.seconds: reading, tokenizing, batching, the forward
passes, merging and checkpoints; for Ray from the moment its workers have loaded the model).
The Ray runtime start and the workers' start (a process and a model load each) are reported
apart, once per run. The machine is shared, so the engines take turns, --repeats times, and
the best of each is kept. Every Ray result is checked equal to the local one.
Target: Ray at 1 worker within 15% of local (overhead = 1 - ray:1 / local).

--pass faithfulness: the same for a faithfulness run (attnscope.faithfulness, --methods on the first --documents
sentences, --max-length tokens each): documents/s of the local run and of engine="ray" with 1 and 2 workers, the
seconds counted from the moment the workers have loaded the model (`WorkersReady`), the per-example rows and the
summary checked equal to the local ones. (The index build's Ray comparison is benchmarks/bench_index.py --parts ray.)

--pass heads: the same for the heads pass (attnscope.corpus.heads.head_pass: every two heads' Jensen-Shannon distance
and each head's behaviour, MiniLM's 72 heads) on the first --documents UD sentences (128 tokens at most, batches of
8): seconds of the local pass and of engine="ray" with 1 and 2 workers once the workers are ready, and wall; every Ray
heads.npz checked byte for byte the local one.

Usage: .venv/bin/python benchmarks/bench_ray.py [--documents 1000] [--repeats 2] [--threads 1]
       .venv/bin/python benchmarks/bench_ray.py --pass faithfulness [--documents 16] [--methods M1,M2]
       .venv/bin/python benchmarks/bench_ray.py --pass heads [--documents 200]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch

import attnscope
from attnscope.stats import RunResult, Settings, Source, run
from attnscope.stats.distributed import run as run_ray
from corpus import ud_dev

UD_DEV = ud_dev()


def timed_local(model: attnscope.Model, settings: Settings, out: Path) -> tuple[RunResult, float]:
    start = time.perf_counter()
    result = run(Source(str(UD_DEV)), model, settings, out)
    return result, time.perf_counter() - start


def timed_ray(model: attnscope.Model, settings: Settings, out: Path, workers: int,
              threads: int) -> tuple[RunResult, float]:
    start = time.perf_counter()
    result = run_ray(Source(str(UD_DEV)), model, settings, out, workers=workers, threads=threads,
                     worker_model=attnscope.models.DEFAULT_MODEL)
    return result, time.perf_counter() - start


class WorkersReady(logging.Handler):
    """The moment each Ray pass's workers have all loaded the model (the last "Ray worker N: pid" line logged by
    attnscope.stats.distributed.passes)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.times: list[float] = []
        logger = logging.getLogger("attnscope.stats.distributed.passes")
        logger.setLevel(logging.INFO)
        logger.addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("Ray worker"):
            self.times.append(time.perf_counter())


def timed_pass(run: Callable[[], Any], ready: WorkersReady) -> tuple[Any, float, float]:
    """(result, wall seconds, seconds after the workers were ready; the wall for a local run)."""
    before = len(ready.times)
    start = time.perf_counter()
    result = run()
    end = time.perf_counter()
    return result, end - start, end - (ready.times[-1] if len(ready.times) > before else start)


def engines(args: argparse.Namespace, one: Callable[[Path, dict[str, Any]], Any],
            same: Callable[[Any, Any], bool]) -> tuple[Any, dict[str, float], dict[str, float], float]:
    """A corpus pass (one(out, engine keywords) -> its result) local and on Ray with 1 and 2 workers, --repeats times
    in turns, each Ray result checked `same` as the local one: (the local result, best seconds after the workers
    were ready, best wall seconds, the Ray runtime's start)."""
    import ray

    ready = WorkersReady()
    began = time.perf_counter()
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
    ray_start = time.perf_counter() - began
    steady: dict[str, float] = {}
    wall: dict[str, float] = {}
    reference = None
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for r in range(args.repeats):
                reference = None
                for name, workers in (("local", None), ("ray:1", 1), ("ray:2", 2)):
                    kw: dict[str, Any] = {} if workers is None else {"engine": "ray", "workers": workers,
                                                                     "threads": args.threads}
                    out = Path(tmp) / f"{name.replace(':', '')}-{r}"
                    result, seconds, after = timed_pass(partial(one, out, kw), ready)
                    if reference is None:
                        reference = result
                    elif not same(reference, result):
                        raise SystemExit(f"{name} differs from the local run")
                    steady[name] = min(steady.get(name, float("inf")), after)
                    wall[name] = min(wall.get(name, float("inf")), seconds)
    finally:
        ray.shutdown()
    return reference, steady, wall, ray_start


def engines_report(args: argparse.Namespace, what: dict[str, Any], steady: dict[str, float], wall: dict[str, float],
                   ray_start: float) -> None:
    report = {
        **what, "threads_per_model_process": args.threads, "cpus": os.cpu_count(),
        "load_average": os.getloadavg(), "ray_runtime_start_s": round(ray_start, 2),
        "seconds_after_workers_ready": {k: round(v, 2) for k, v in steady.items()},
        "wall_s_including_worker_start": {k: round(v, 2) for k, v in wall.items()},
        "ray2_speedup_over_local": round(steady["local"] / steady["ray:2"], 2),
        "ray2_speedup_over_local_wall": round(wall["local"] / wall["ray:2"], 2),
        "results_identical": True,
    }
    print(json.dumps(report, indent=2))


def faithfulness_pass(args: argparse.Namespace) -> None:
    """Local against engine="ray" with 1 and 2 workers on the same sentences (see the module's docstring)."""
    from attnscope.faithfulness import faithfulness

    torch.set_num_threads(args.threads)
    model = attnscope.load_model(args.model)
    kw: dict[str, Any] = {"methods": args.methods, "max_length": args.max_length, "limit": args.documents}
    _, steady, wall, ray_start = engines(
        args, lambda out, where: faithfulness(UD_DEV, out, model, **kw, **where),
        lambda a, b: bool(a.rows == b.rows and a.summary == b.summary))
    engines_report(args, {"pass": "faithfulness", "model": model.name, "documents": args.documents,
                          "methods": args.methods, "max_length": args.max_length}, steady, wall, ray_start)


def heads_pass(args: argparse.Namespace) -> None:
    """The heads pass (attnscope.corpus.heads.head_pass) local against engine="ray" with 1 and 2 workers on the
    first --documents UD sentences; every Ray heads.npz checked byte for byte the local one."""
    from attnscope.corpus.heads import FILE, head_pass
    from attnscope.corpus.tags import TaggedSource

    torch.set_num_threads(args.threads)
    model = attnscope.load_model(args.model)
    settings = Settings(max_length=min(128, model.max_positions), batch_size=8, limit=args.documents)
    local, steady, wall, ray_start = engines(
        args, lambda out, where: head_pass(TaggedSource(str(UD_DEV)), out, model, settings=settings, **where),
        lambda a, b: a.path.read_bytes() == b.path.read_bytes())  # heads.npz, read before the directory goes
    engines_report(args, {"pass": "heads", "model": model.name, "documents": args.documents,
                          "tokens": local.sums.tokens, "heads": model.n_layers * model.n_heads,
                          "identical": f"every Ray {FILE} byte for byte the local one"}, steady, wall, ray_start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pass", dest="corpus_pass", choices=("stats", "faithfulness", "heads"),
                        default="stats")
    parser.add_argument("--documents", type=int, default=None,
                        help="default 1000 (stats), 16 (faithfulness), 200 (heads)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--model", default=None, help="faithfulness, heads: the model (default the bundled MiniLM)")
    parser.add_argument("--methods", default="attention,rollout,alti",
                        help="faithfulness: the methods (leave-one-out always runs)")
    parser.add_argument("--max-length", type=int, default=24, help="faithfulness: tokens per sentence")
    args = parser.parse_args()
    if args.corpus_pass == "faithfulness":
        args.documents = args.documents or 16
        faithfulness_pass(args)
        return
    if args.corpus_pass == "heads":
        args.documents = args.documents or 200
        heads_pass(args)
        return
    args.documents = args.documents or 1000
    import ray

    torch.set_num_threads(args.threads)
    model = attnscope.load_model()
    settings = Settings(limit=args.documents)
    began = time.perf_counter()
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False,
             logging_level=logging.WARNING)
    ray_start = time.perf_counter() - began
    best: dict[str, float] = {}
    wall: dict[str, float] = {}
    tokens = 0
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            reference, seconds = timed_local(model, settings, Path(tmp) / f"local{r}")
            tokens = reference.state.tokens
            best["local"] = max(best.get("local", 0.0), tokens / reference.seconds)
            wall["local"] = min(wall.get("local", float("inf")), seconds)
            for workers in (1, 2):
                name = f"ray:{workers}"
                result, seconds = timed_ray(model, settings, Path(tmp) / f"{name}-{r}", workers, args.threads)
                if result.state.to_dict() != reference.state.to_dict():
                    raise SystemExit(f"{name} differs from the local engine")
                best[name] = max(best.get(name, 0.0), tokens / result.seconds)
                wall[name] = min(wall.get(name, float("inf")), seconds)
    ray.shutdown()
    report = {
        "documents": args.documents, "tokens": tokens, "threads_per_model_process": args.threads,
        "cpus": os.cpu_count(), "load_average": os.getloadavg(), "ray_runtime_start_s": round(ray_start, 2),
        "tokens_per_s": {k: round(v) for k, v in best.items()},
        "wall_s_including_worker_start": {k: round(v, 2) for k, v in wall.items()},
        "ray1_overhead": round(1 - best["ray:1"] / best["local"], 3),
        "ray2_speedup_over_local": round(best["ray:2"] / best["local"], 2),
        "results_identical": True,
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
