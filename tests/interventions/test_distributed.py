"""Head importance on Ray: the same sums as the local engine on real UD sentences (an encoder and a causal LM,
random weights), and a run interrupted on Ray resumes from its checkpoint to the local engine's numbers."""

from __future__ import annotations

import json
from collections.abc import Callable
from itertools import islice
from pathlib import Path

import pytest
import torch

import attnscope
from attnscope.interventions.importance import CHECKPOINT, ImportanceSettings, Sums, accumulate
from attnscope.stats.sources import Source
from tests.support.ray_runtime import ray_runtime  # noqa: F401 (the shared Ray runtime fixture)

SETTINGS = ImportanceSettings(batch_size=4, checkpoint_every=1)  # 12 sentences: 3 batches, a checkpoint after each
SOURCE = {"kind": "test"}
TOL = 1e-6
pytestmark = pytest.mark.usefixtures("one_torch_thread")  # the local baselines on one thread, like each worker


@pytest.fixture(scope="module")
def sentences(ud_dev: Path) -> list[str]:
    return [d.text for d in islice(iter(Source(str(ud_dev))), 12)]


def _on_ray(m: attnscope.Model, texts: list[str], out: Path, resume: bool = False,
            progress: Callable[[int, int], None] | None = None) -> Sums:
    from attnscope.interventions.distributed import accumulate as on_ray

    return on_ray(m, texts, out, SOURCE, SETTINGS, resume, progress, workers=2, threads=1)


def _gap(a: Sums, b: Sums) -> float:
    return float((torch.tensor(a.total) - torch.tensor(b.total)).abs().max())


@pytest.mark.usefixtures("ray_runtime")
def test_ray_equals_local(tiny_model: Callable[[str], attnscope.Model], sentences: list[str],
                          tmp_path: Path) -> None:
    m = tiny_model("bert")  # an encoder: forward-mode gradients of the pooled embedding, the heavier path
    local = accumulate(m, sentences, tmp_path / "local", SOURCE, SETTINGS)
    ray = _on_ray(m, sentences, tmp_path / "ray")
    assert (ray.documents, ray.tokens) == (local.documents, local.tokens)
    assert ray.documents == 12
    assert float(torch.tensor(local.total).abs().min()) > 0  # every head has a gradient to compare
    assert _gap(ray, local) <= TOL
    saved = json.loads((tmp_path / "ray" / CHECKPOINT).read_text(encoding="utf-8"))
    assert saved["sums"]["documents"] == 12


@pytest.mark.usefixtures("ray_runtime")
def test_interrupted_ray_run_resumes(lm_heads: Callable[[str], attnscope.Model],
                                     sentences: list[str], tmp_path: Path) -> None:
    """Interrupted on Ray after its first batch, resumed on the local engine (the checkpoint is the same
    format): the numbers of one uninterrupted local run. A causal LM: reverse-mode loss gradients."""
    m = lm_heads("gpt2")
    local = accumulate(m, sentences, tmp_path / "local", SOURCE, SETTINGS)

    def interrupt(documents: int, tokens: int) -> None:
        raise KeyboardInterrupt  # once the first batch is folded (and checkpointed)

    with pytest.raises(KeyboardInterrupt):
        _on_ray(m, sentences, tmp_path / "run", progress=interrupt)
    kept = json.loads((tmp_path / "run" / CHECKPOINT).read_text(encoding="utf-8"))["sums"]["documents"]
    assert kept in (4, 8)  # the first folded prefix: batch 0, or batches 0 and 1 if batch 1 finished first
    seen: list[int] = []
    resumed = accumulate(m, sentences, tmp_path / "run", SOURCE, SETTINGS, resume=True,
                         progress=lambda d, t: seen.append(d))
    assert seen == list(range(kept + 4, 13, 4))  # only the batches the checkpoint did not hold ran
    assert (resumed.documents, resumed.tokens) == (local.documents, local.tokens)
    assert _gap(resumed, local) <= TOL


@pytest.mark.parametrize(("flags", "says"), [(("--workers", "2"), "add --engine ray"),
                                             (("--engine", "ray", "--workers", "0"), "--workers must be at least 1")])
def test_cli_cluster_flags_are_validated(ud_dev: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                         flags: tuple[str, ...], says: str) -> None:
    from attnscope.cli.main import main

    code = main(["importance", str(ud_dev), "-o", str(tmp_path / "out"), *flags])
    err = capsys.readouterr().err
    assert code == 2
    assert says in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()  # refused before any model loads or directory is made


def test_a_worker_failure_is_one_line() -> None:
    """stats and importance on Ray say a worker's failure the same way (stats.distributed.workers.worker_error);
    a worker's own AttnscopeError passes through as it is."""
    exceptions = pytest.importorskip("ray.exceptions", reason="the ray extra is not installed")
    from attnscope.errors import AttnscopeError
    from attnscope.stats.distributed.workers import worker_error

    failed = exceptions.RayTaskError("run", "Traceback ...", ValueError("shapes differ\nin layer 3"))
    assert str(worker_error(failed)) == "a Ray worker failed: ValueError: shapes differ"
    assert str(worker_error(failed, " on batch 2", "run again with resume=True")) == \
        "a Ray worker failed on batch 2: ValueError: shapes differ; run again with resume=True"
    own = AttnscopeError("the text is empty: give a sentence to trace")
    assert worker_error(exceptions.RayTaskError("run", "Traceback ...", own)) is own
