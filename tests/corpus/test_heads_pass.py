"""The heads pass on the real MiniLM over a few UD sentences: its distances and shares are those of the model's own
traced attention (scipy's Jensen-Shannon distance), its dependency counts are the corpus statistics', an interrupted
pass resumed ends with the same bits, and the CLI answers bad input in one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from scipy.spatial.distance import jensenshannon

import attnscope
from attnscope.corpus.head_groups import read_groups
from attnscope.corpus.head_sums import FEATURES, load
from attnscope.corpus.heads import FILE, HeadsRun, head_pass
from attnscope.corpus.tags import TaggedSource
from attnscope.stats.engine import Progress, process_documents
from attnscope.stats.settings import Settings
from attnscope.tracing.one_pass import trace
from tests.support.cli import run

DOCS = 12
SETTINGS = Settings(max_length=32, batch_size=3, limit=DOCS, checkpoint_every=2)


@pytest.fixture(scope="module")
def done(minilm: attnscope.Model, ud_dev: Path, tmp_path_factory: pytest.TempPathFactory) -> HeadsRun:
    return head_pass(TaggedSource(str(ud_dev)), tmp_path_factory.mktemp("heads") / "out", minilm, settings=SETTINGS)


def test_distances_and_shares_are_the_traced_attentions(done: HeadsRun, minilm: attnscope.Model,
                                                         ud_dev: Path) -> None:
    docs = [d for _, d in zip(range(DOCS), TaggedSource(str(ud_dev)), strict=False)]
    maps = [np.asarray(trace(d.text, model=minilm, max_length=32).arrays["weights"], dtype=np.float64)
            for d in docs]  # each [layer, head, query, key]
    assert done.sums.tokens == sum(m.shape[2] for m in maps) and done.sums.documents == DOCS
    units = minilm.n_heads
    pairs = [(0, 1), (2, 20), (5, 70), (33, 34)]  # units layer * 12 + head
    for a, b in pairs:
        want = np.mean([jensenshannon(m.reshape(-1, *m.shape[2:])[a, t], m.reshape(-1, *m.shape[2:])[b, t])
                        for m in maps for t in range(m.shape[2])])
        assert abs(done.sums.distance()[a, b] - want) <= 1e-5, (a, b)
    previous = np.mean([m[0, 2, t, t - 1] for m in maps for t in range(1, m.shape[2])])  # head 0.2
    assert abs(done.sums.means()["previous"][2] - previous) <= 1e-6
    assert done.sums.distance()[0, 0] == 0.0 and units == 12


def test_the_dependency_counts_are_the_corpus_statistics(done: HeadsRun, minilm: attnscope.Model,
                                                         ud_dev: Path) -> None:
    docs = [d for _, d in zip(range(DOCS), TaggedSource(str(ud_dev)), strict=False)]
    state = process_documents(minilm, docs, Settings(max_length=32, batch_size=3))
    assert state.syntax is not None and done.syntax is not None
    assert done.syntax.to_dict() == state.syntax.to_dict()


def test_an_interrupted_pass_resumed_gives_the_same_bits(done: HeadsRun, minilm: attnscope.Model, ud_dev: Path,
                                                         tmp_path: Path) -> None:
    seen: list[Progress] = []

    def stop(progress: Progress) -> None:  # dies after batch 3: the checkpoint (every 2) holds batches 1-2
        seen.append(progress)
        if len(seen) == 3:
            raise RuntimeError("killed")

    with pytest.raises(RuntimeError, match="killed"):
        head_pass(TaggedSource(str(ud_dev)), tmp_path, minilm, settings=SETTINGS, progress=stop)
    partial, meta = load(tmp_path / FILE)
    assert not meta["complete"] and 0 < partial.documents < seen[-1].documents
    again = head_pass(TaggedSource(str(ud_dev)), tmp_path, minilm, settings=SETTINGS, resume=True)
    assert again.resumed_from == partial.documents
    assert np.array_equal(again.sums.js, done.sums.js)
    for name in FEATURES:
        assert np.array_equal(again.sums.features[name], done.sums.features[name])
    assert again.syntax is not None and done.syntax is not None
    assert again.syntax.to_dict() == done.syntax.to_dict()
    g = read_groups(tmp_path)
    assert g.labels[2] == ["previous"]  # MiniLM's head 0.2 attends to the previous token (a share of ~1.0)


def test_the_cli_refuses_bad_input_in_one_line(done: HeadsRun, ud_dev: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    out = str(done.path.parent)
    code, _, err = run(capsys, "heads", str(ud_dev), "-o", out, "--limit", "12")
    assert code == 2 and err.count("\n") == 1 and "--resume" in err and "exists" in err
    code, _, err = run(capsys, "heads", str(ud_dev), "-o", out, "--limit", "12", "--max-length", "24", "--resume")
    assert code == 2 and err.count("\n") == 1 and "max_length 32 -> 24" in err
    code, _, err = run(capsys, "heads-compare", out, str(tmp_path / "nothing"))
    assert code == 2 and err.count("\n") == 1 and "attnscope heads" in err
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / FILE).write_bytes(b"not a heads file")
    code, _, err = run(capsys, "heads-compare", out, str(bad))
    assert code == 2 and err.count("\n") == 1 and "not a heads file" in err


def test_the_cli_writes_the_page_and_compares(ud_dev: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                              done: HeadsRun) -> None:
    out = tmp_path / "out"
    code, stdout, _ = run(capsys, "heads", str(ud_dev), "-o", str(out), "--limit", "12", "--max-length", "32",
                          "--batch-size", "3", "--clusters", "5", "--example", "A <b>bold</b> example.",
                          "--format", "json")
    assert code == 0
    answer = json.loads(stdout)
    assert answer["heads"]["names"][20] == "1.8" and max(answer["heads"]["clusters"]) == 5
    assert np.array_equal(answer["heads"]["distance"], done.sums.distance())  # the same sums, through JSON
    page = Path(answer["page"]).read_text(encoding="utf-8")
    assert 'id="attnscope-heads"' in page and 'id="attnscope-data"' in page and "<b>bold" not in page
    code, stdout, _ = run(capsys, "heads-compare", str(out), str(done.path), "-o", str(tmp_path / "c.html"))
    assert code == 0 and "nearest all-MiniLM-L6-v2 head of each all-MiniLM-L6-v2 head" in stdout
    assert " 0.2 -> 0.2    0.000  previous / previous" in stdout
    assert '"comparison":{"a":"all-MiniLM-L6-v2"' in (tmp_path / "c.html").read_text(encoding="utf-8")
