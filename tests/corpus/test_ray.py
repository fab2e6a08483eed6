"""build_index(..., engine="ray") and `attnscope index --engine ray` on 2 workers: every file of the index (arrays,
documents, manifest with its checksums, the build checkpoint) byte for byte a local build's, on the real UD dev
slice with MiniLM, where UD labels first appear in later batches (so the label codes are the driver's, in order);
a Ray build interrupted and resumed equals an uninterrupted one."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

import attnscope
from attnscope.cli.main import main
from attnscope.corpus.index import BuildResult, build_index
from attnscope.corpus.tags import TaggedSource
from attnscope.stats.engine import Progress
from attnscope.stats.settings import Settings
from tests.support.corpus import DOCUMENTS, HEADS, LAYERS
from tests.support.ray_runtime import ray_runtime  # noqa: F401 (the shared Ray runtime fixture)

# 40 sentences in 3 chunks of 16 (2 batches of 8): several chunks and batches, each a Ray task
SETTINGS = Settings(limit=DOCUMENTS, batch_size=8, chunk_batches=2, checkpoint_every=2)

pytestmark = pytest.mark.usefixtures("ray_runtime", "one_torch_thread")


class Stop(KeyboardInterrupt):
    pass


def build(ud_dev: Path, out: Path, model: attnscope.Model, **kw: object) -> BuildResult:
    return build_index(TaggedSource(str(ud_dev)), out, model, layers=LAYERS, heads=HEADS, settings=SETTINGS,
                       ann=(), **kw)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def local(ud_dev: Path, minilm: attnscope.Model, tmp_path_factory: pytest.TempPathFactory,
          one_torch_thread: None) -> Path:
    """The local build every Ray build must equal, on one torch thread as each worker here."""
    out = tmp_path_factory.mktemp("index") / "local"
    build(ud_dev, out, minilm)
    return out


def files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def assert_same_index(local: Path, other: Path) -> None:
    """Every file byte for byte, and the manifest's checksums are the files' own."""
    mine, theirs = files(local), files(other)
    assert sorted(mine) == sorted(theirs) and len(mine) > 10
    for name in mine:
        assert mine[name] == theirs[name], name
    manifest = json.loads(theirs["manifest.json"])
    sums = {a["file"]: a["sha256"] for a in manifest["arrays"].values()}
    assert sums and all(hashlib.sha256(theirs[f]).hexdigest() == s for f, s in sums.items())


def test_ray_build_on_two_workers_equals_local_byte_for_byte(local: Path, ud_dev: Path, minilm: attnscope.Model,
                                                             tmp_path: Path) -> None:
    result = build(ud_dev, tmp_path / "ray", minilm, engine="ray", workers=2, threads=1)
    assert result.documents == DOCUMENTS
    vocab = json.loads((tmp_path / "ray" / "manifest.json").read_text(encoding="utf-8"))["vocab"]
    assert len(vocab["deprel"]) > 20  # labels met batch after batch: coded by the driver in the local order
    assert_same_index(local, tmp_path / "ray")


def test_an_interrupted_ray_build_resumes_to_the_same_index(local: Path, ud_dev: Path, minilm: attnscope.Model,
                                                            tmp_path: Path) -> None:
    out = tmp_path / "ray"

    def stop_midway(p: Progress) -> None:
        if p.documents >= 16:
            raise Stop

    with pytest.raises(Stop):
        build(ud_dev, out, minilm, engine="ray", workers=2, threads=1, progress=stop_midway)
    assert not (out / "manifest.json").exists()
    resumed = build(ud_dev, out, minilm, resume=True, engine="ray", workers=2, threads=1)
    assert 16 <= resumed.resumed_from < DOCUMENTS
    assert_same_index(local, out)


def test_cli_index_engine_ray_writes_the_local_files(ud_dev: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    args = ["index", str(ud_dev), "--limit", "24", "--batch-size", "8", "--layers", "0,3", "--heads", "1,4",
            "--ann", "none", "--format", "json", "--threads", "1"]
    assert main([*args, "-o", str(tmp_path / "local")]) == 0
    assert main([*args, "-o", str(tmp_path / "ray"), "--engine", "ray", "--workers", "2"]) == 0
    reports = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["documents"] for r in reports] == [24, 24]
    assert_same_index(tmp_path / "local", tmp_path / "ray")
