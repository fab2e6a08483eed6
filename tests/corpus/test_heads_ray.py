"""`attnscope heads --engine ray` and head_pass(..., engine="ray") on 2 workers: heads.npz (the float64 sums of every
two heads' Jensen-Shannon distances, the behaviour sums, the UD dependency counts, the checkpoint's meta) byte for
byte the local pass's, on the real UD dev slice with MiniLM; a Ray pass interrupted and resumed equals an
uninterrupted one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import attnscope
from attnscope.cli.main import main
from attnscope.corpus.head_sums import load
from attnscope.corpus.heads import FILE, HeadsRun, head_pass
from attnscope.corpus.tags import TaggedSource
from attnscope.stats.engine import Progress
from attnscope.stats.settings import Settings
from tests.support.ray_runtime import ray_runtime  # noqa: F401 (the shared Ray runtime fixture)

DOCUMENTS = 24  # the first 24 UD sentences: 3 batches of 8, each a Ray task
# the library's settings and the CLI's flags for them
SETTINGS = Settings(max_length=128, batch_size=8, limit=DOCUMENTS, checkpoint_every=2)
CLI = ["--max-length", "128", "--limit", str(DOCUMENTS), "--checkpoint-every", "2", "--threads", "1",
       "--format", "json", "--no-progress"]

pytestmark = pytest.mark.usefixtures("ray_runtime", "one_torch_thread")


class Stop(KeyboardInterrupt):
    pass


def heads(ud_dev: Path, out: Path, model: attnscope.Model, **kw: object) -> HeadsRun:
    return head_pass(TaggedSource(str(ud_dev)), out, model, settings=SETTINGS, **kw)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def local(ud_dev: Path, minilm: attnscope.Model, tmp_path_factory: pytest.TempPathFactory,
          one_torch_thread: None) -> Path:
    """The local pass every Ray pass must equal, on one torch thread as each worker here."""
    out = tmp_path_factory.mktemp("heads") / "local"
    heads(ud_dev, out, minilm)
    return out / FILE


def test_cli_heads_engine_ray_writes_the_local_sums_byte_for_byte(local: Path, ud_dev: Path, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "ray"
    assert main(["heads", str(ud_dev), "-o", str(out), "--engine", "ray", "--workers", "2", *CLI]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["heads"]["documents"] == DOCUMENTS
    sums, meta = load(out / FILE)
    assert sums.documents == DOCUMENTS and meta["complete"] and meta["syntax"]["total"]  # UD counts came back too
    assert (out / FILE).read_bytes() == local.read_bytes()


def test_an_interrupted_ray_pass_resumes_to_the_same_sums(local: Path, ud_dev: Path, minilm: attnscope.Model,
                                                          tmp_path: Path) -> None:
    out = tmp_path / "ray"

    def stop_midway(p: Progress) -> None:
        if p.documents >= 8:
            raise Stop

    with pytest.raises(Stop):
        heads(ud_dev, out, minilm, engine="ray", workers=2, threads=1, progress=stop_midway)
    assert not load(out / FILE)[1]["complete"]
    resumed = heads(ud_dev, out, minilm, resume=True, engine="ray", workers=2, threads=1)
    assert 8 <= resumed.resumed_from < DOCUMENTS
    assert (out / FILE).read_bytes() == local.read_bytes()
