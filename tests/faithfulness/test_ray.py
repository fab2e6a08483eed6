"""faithfulness(..., engine="ray") on 2 workers against the local run, on the real UD dev slice with MiniLM: the
per-example rows in the same order and the summary bit for bit, a Ray run interrupted and resumed (on Ray or
locally) equal to an uninterrupted one, and one-line refusals for what cannot run."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

import attnscope
from attnscope.faithfulness import faithfulness
from attnscope.faithfulness.run import FaithfulnessResult, Progress
from attnscope.stats.distributed import Engine
from tests.support.ray_runtime import ray_runtime  # noqa: F401 (the shared Ray runtime fixture)

# 4 sentences, two methods (leave-one-out comes with them), short: every row kind, in seconds per document
KW: dict[str, Any] = {"methods": "attention,rollout", "max_length": 12, "seeds": 2, "limit": 4}
FILES = ("rows.jsonl", "examples.json", "summary.json", "checkpoint.json")


class Stop(KeyboardInterrupt):
    pass


@pytest.fixture(scope="module")
def local(ud_dev: Path, minilm: attnscope.Model, tmp_path_factory: pytest.TempPathFactory,
          one_torch_thread: None) -> FaithfulnessResult:
    """The local run every Ray run must equal, on one torch thread as each worker here."""
    return faithfulness(ud_dev, tmp_path_factory.mktemp("faith") / "local", minilm, **KW)


def same_files(a: Path, b: Path) -> None:
    for name in FILES:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


@pytest.mark.usefixtures("ray_runtime", "one_torch_thread")
def test_ray_on_two_workers_equals_local_bit_for_bit(local: FaithfulnessResult, ud_dev: Path,
                                                     minilm: attnscope.Model, tmp_path: Path) -> None:
    seen: list[int] = []
    on_ray = faithfulness(ud_dev, tmp_path / "ray", minilm, engine="ray", workers=2, threads=1,
                          progress=lambda p: seen.append(p.documents), **KW)
    assert seen == [1, 2, 3, 4]  # handed back in the documents' order
    assert [(r["example"], r["method"]) for r in on_ray.rows] == [(r["example"], r["method"]) for r in local.rows]
    assert on_ray.rows == local.rows and on_ray.summary == local.summary
    assert {r["method"] for r in on_ray.rows} == {"attention", "rollout", "leave_one_out", "random_0", "random_1",
                                                  "position"}
    same_files(local.outdir, on_ray.outdir)


@pytest.fixture(scope="module")
def interrupted(ray_runtime: Any, ud_dev: Path, minilm: attnscope.Model,  # noqa: F811 (the imported fixture)
                tmp_path_factory: pytest.TempPathFactory, one_torch_thread: None) -> Path:
    """A Ray run stopped after its second document (read-only): each resume test continues a copy of it."""
    out = tmp_path_factory.mktemp("interrupted") / "out"

    def stop_after_two(p: Progress) -> None:
        if p.documents >= 2:
            raise Stop

    with pytest.raises(Stop):
        faithfulness(ud_dev, out, minilm, engine="ray", workers=2, threads=1, progress=stop_after_two, **KW)
    assert '"documents": 2' in (out / "checkpoint.json").read_text(encoding="utf-8")  # checkpointed in order
    return out


@pytest.mark.parametrize("resume_on", ["ray", "local"])
@pytest.mark.usefixtures("ray_runtime", "one_torch_thread")
def test_an_interrupted_ray_run_resumes_to_the_same_rows(resume_on: str, interrupted: Path, local: FaithfulnessResult,
                                                         ud_dev: Path, minilm: attnscope.Model, tmp_path: Path) -> None:
    out = tmp_path / "out"
    shutil.copytree(interrupted, out)
    ray_kw: dict[str, Any] = {"engine": "ray", "workers": 2, "threads": 1} if resume_on == "ray" else {}
    resumed = faithfulness(ud_dev, out, minilm, resume=True, **ray_kw, **KW)
    assert resumed.resumed_from == 2
    assert resumed.rows == local.rows and resumed.summary == local.summary
    same_files(local.outdir, out)


def test_bad_engine_options_are_one_line_naming_the_parameter(ud_dev: Path, tmp_path: Path) -> None:
    with pytest.raises(attnscope.AttnscopeError, match="is not an engine: choose local or ray") as bad:
        faithfulness(ud_dev, tmp_path / "a", engine="spark", **KW)
    assert bad.value.parameter == "engine"
    with pytest.raises(attnscope.AttnscopeError, match="add engine='ray'"):
        faithfulness(ud_dev, tmp_path / "b", workers=2, **KW)
    with pytest.raises(attnscope.AttnscopeError, match="workers=0 must be a positive integer"):
        faithfulness(ud_dev, tmp_path / "c", engine="ray", workers=0, **KW)
    with pytest.raises(attnscope.AttnscopeError, match="drop them with engine='ray'"):
        faithfulness(ud_dev, tmp_path / "d", engine="ray", dtype="bfloat16", **KW)
    assert not any((tmp_path / d).exists() for d in "abcd")  # refused before anything is written


def test_without_ray_the_message_says_how_to_install_it(ud_dev: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # as if the ray extra were not installed
    with pytest.raises(attnscope.AttnscopeError) as missing:
        faithfulness(ud_dev, tmp_path / "out", engine="ray", **KW)
    assert str(missing.value) == "engine='ray' needs Ray, which is not installed: pip install 'attnscope[ray]'"
    assert not (tmp_path / "out").exists()


def test_workers_load_a_named_model_by_name_and_a_loaded_one_is_shipped(minilm: attnscope.Model) -> None:
    assert Engine.of("local") == Engine()
    pytest.importorskip("ray")
    assert Engine.of("ray", model=None).worker_model == attnscope.models.DEFAULT_MODEL
    assert Engine.of("ray", model="smollm2").worker_model == "smollm2"
    assert Engine.of("ray", model=minilm).worker_model is None  # shipped: it may be changed in memory


@pytest.mark.usefixtures("ray_runtime", "one_torch_thread")
def test_the_command_with_engine_ray_writes_the_local_files(local: FaithfulnessResult, ud_dev: Path,
                                                            tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from attnscope.cli.main import main

    assert main(["faithfulness", str(ud_dev), "-o", str(tmp_path / "cli"), "--engine", "ray", "--workers", "2",
                 "--limit", "4", "--methods", "attention,rollout", "--max-length", "12", "--seeds", "2",
                 "--no-progress", "--threads", "1", "--format", "json"]) == 0
    assert '"examples": 4' in capsys.readouterr().out
    same_files(local.outdir, tmp_path / "cli")
