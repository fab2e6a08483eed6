"""The Ray engine against the local engine on the real UD English dev set: exact equality whatever
the number of workers, with a worker killed mid-run, gone for good, or the run interrupted and resumed."""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import shutil
import signal
from pathlib import Path
from typing import Any

import pytest

import attnscope
from attnscope.stats import Progress, RunResult, Source, run
from attnscope.stats.distributed import run as run_ray
from attnscope.stats.state import StatsState
from tests.support.distributed import SETTINGS

pytestmark = pytest.mark.usefixtures("ray_runtime")


def assert_same(ray_state: StatsState, local_state: StatsState) -> None:
    """Bit-for-bit: the exact integer sums, documents, tokens and syntax counts all equal."""
    assert ray_state.to_dict() == local_state.to_dict()
    for name in local_state.metrics:  # and so the published figures (the 1e-6, with room to spare)
        assert abs(ray_state.mean(name) - local_state.mean(name)).max(initial=0.0) <= 1e-6


def stats_actors(ray: Any) -> list[Any]:
    names = sorted(n for n in ray.util.list_named_actors() if n.startswith("attnscope-stats-"))
    return [ray.get_actor(n) for n in names]


@pytest.mark.parametrize("workers", [1, 2])
def test_equal_to_local(workers: int, minilm: attnscope.Model, ud_dev: Path, local_result: RunResult,
                        tmp_path: Path) -> None:
    result = run_ray(Source(str(ud_dev)), minilm, SETTINGS, tmp_path / "out", workers=workers, threads=1)
    assert result.state.documents == 80
    assert_same(result.state, local_result.state)
    assert result.state.syntax is not None and result.state.syntax.to_dict() == local_result.state.syntax.to_dict()


def test_killed_worker_is_restarted_and_loses_nothing(ray_runtime: Any, minilm: attnscope.Model, ud_dev: Path,
                                                       local_result: RunResult, tmp_path: Path,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    ray = ray_runtime
    caplog.set_level(logging.INFO, logger="attnscope.stats.distributed.engine")
    seen: list[Progress] = []
    killed: dict[str, int] = {}

    def on_progress(p: Progress) -> None:
        seen.append(p)
        if not killed:  # first finished batch: the other worker still has batches queued on it
            pids = [int(m) for m in re.findall(r"Ray worker \d+: pid (\d+)", caplog.text)]
            killed["pid"] = pids[1]
            os.kill(pids[1], signal.SIGKILL)  # the process dies mid-run, as on a lost node or the OOM killer
        elif len(seen) == 6:
            killed["after"] = ray.get(stats_actors(ray)[1].describe.remote())["pid"]

    result = run_ray(Source(str(ud_dev)), minilm, SETTINGS, tmp_path / "out", progress=on_progress,
                     workers=2, threads=1)
    assert killed["after"] != killed["pid"]  # Ray restarted the worker (a new process, the model loaded again)
    assert_same(result.state, local_result.state)
    assert [p.documents for p in seen] == sorted(p.documents for p in seen) and seen[-1].documents == 80


def test_worker_gone_for_good_has_its_batches_sent_to_the_others(ray_runtime: Any, minilm: attnscope.Model,
                                                                 ud_dev: Path, local_result: RunResult,
                                                                 tmp_path: Path) -> None:
    ray = ray_runtime
    gone: list[str] = []

    def on_progress(p: Progress) -> None:
        if not gone:
            actor = stats_actors(ray)[0]
            ray.kill(actor, no_restart=True)
            gone.append("worker 0")

    result = run_ray(Source(str(ud_dev)), minilm, SETTINGS, tmp_path / "out", progress=on_progress,
                     workers=2, threads=1)
    assert gone and result.state.documents == 80
    assert_same(result.state, local_result.state)


class Stop(KeyboardInterrupt):
    pass


@pytest.fixture(scope="module")
def interrupted(ray_runtime: Any, minilm: attnscope.Model, ud_dev: Path,
                tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Ray run stopped midway (read-only): each resume test continues a copy of what it left."""
    out = tmp_path_factory.mktemp("interrupted") / "out"

    def stop_midway(p: Progress) -> None:
        if p.documents >= 30:
            raise Stop

    with pytest.raises(Stop):
        run_ray(Source(str(ud_dev)), minilm, SETTINGS, out, progress=stop_midway, workers=2, threads=1)
    checkpoint = (out / "checkpoint.json").read_text(encoding="utf-8")
    assert '"complete": false' in checkpoint
    return out


@pytest.mark.parametrize("resume_on", ["ray", "local"])
def test_interrupted_run_resumes_to_the_same_numbers(resume_on: str, interrupted: Path, minilm: attnscope.Model,
                                                     ud_dev: Path, local_result: RunResult, tmp_path: Path) -> None:
    out = tmp_path / "out"
    shutil.copytree(interrupted, out)
    if resume_on == "ray":
        result = run_ray(Source(str(ud_dev)), minilm, SETTINGS, out, resume=True, workers=2, threads=1)
    else:  # the checkpoint is the local engine's format: either engine continues the other's run
        result = run(Source(str(ud_dev)), minilm, SETTINGS, out, resume=True)
    assert 0 < result.resumed_from < 80
    assert_same(result.state, local_result.state)


def test_local_run_resumes_on_ray(minilm: attnscope.Model, ud_dev: Path, local_result: RunResult,
                                  tmp_path: Path) -> None:
    out = tmp_path / "out"

    def stop_midway(p: Progress) -> None:
        if p.documents >= 40:
            raise Stop

    with pytest.raises(Stop):
        run(Source(str(ud_dev)), minilm, SETTINGS, out, progress=stop_midway)
    result = run_ray(Source(str(ud_dev)), minilm, SETTINGS, out, resume=True, workers=2, threads=1)
    assert result.resumed_from >= 40
    assert_same(result.state, local_result.state)


def test_existing_output_is_refused_as_locally(minilm: attnscope.Model, ud_dev: Path, tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine", encoding="utf-8")
    with pytest.raises(attnscope.AttnscopeError, match="already exists and is not empty"):
        run_ray(Source(str(ud_dev)), minilm, SETTINGS, tmp_path / "out", workers=1)


def test_a_metric_set_of_ones_own_reaches_the_workers_in_the_settings(minilm: attnscope.Model, ud_dev: Path,
                                                                      tmp_path: Path) -> None:
    """A MetricSet made here (a lambda input, nothing registered anywhere) travels to the workers inside the
    settings: the Ray columns equal the local ones."""
    from attnscope.stats import Metric, MetricSet
    from attnscope.stats.metrics import attention_to

    doubled = MetricSet("doubled", (Metric("cls_doubled", attention_to("cls"), "twice the attention to [CLS]",
                                           "doubled"),), (("doubled", lambda view: 2 * view.call.weights),))
    settings = dataclasses.replace(SETTINGS, limit=16, metric_sets=(doubled,))
    local = run(Source(str(ud_dev)), minilm, settings, tmp_path / "local")
    on_ray = run_ray(Source(str(ud_dev)), minilm, settings, tmp_path / "ray", workers=1, threads=1)
    assert "cls_doubled" in on_ray.state.metrics and int(on_ray.state.count["cls_doubled"].min()) == 16
    assert_same(on_ray.state, local.state)
