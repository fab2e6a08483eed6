"""`attnscope heads` killed with SIGKILL and resumed with --resume ends with the same bits as a pass never stopped
(the checkpoint, heads.npz, is replaced atomically after its batches: a kill at any moment leaves the last one)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

import attnscope
from attnscope.corpus.head_sums import FEATURES, load
from attnscope.corpus.heads import FILE, head_pass
from attnscope.corpus.tags import TaggedSource
from attnscope.errors import AttnscopeError
from attnscope.stats.settings import Settings
from tests.support.corpus import cli

ARGS = ["--limit", "24", "--batch-size", "3", "--checkpoint-every", "1", "--max-length", "32", "--format", "json",
        "--threads", "1"]


def _documents(out: Path) -> int:
    try:
        return load(out / FILE)[0].documents
    except (AttnscopeError, OSError):
        return 0


@pytest.mark.usefixtures("one_torch_thread")  # the same threads as the command's --threads 1: the same sums
def test_a_pass_killed_with_sigkill_and_resumed_equals_an_uninterrupted_one(ud_dev: Path, tmp_path: Path,
                                                                            minilm: attnscope.Model) -> None:
    out = tmp_path / "killed"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cli("heads", str(ud_dev), "-o", str(out), *ARGS), env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None and _documents(out) < 6:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed, meta = load(out / FILE)
    assert not meta["complete"] and 0 < killed.documents < 24, "the pass ended before it was killed"
    resumed = subprocess.run(cli("heads", str(ud_dev), "-o", str(out), "--resume", *ARGS), env=env,
                             capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["resumed_from_documents"] == killed.documents
    whole = head_pass(TaggedSource(str(ud_dev)), tmp_path / "whole", minilm,
                      settings=Settings(max_length=32, batch_size=3, limit=24))
    done, meta = load(out / FILE)
    assert meta["complete"] and done.documents == 24
    assert np.array_equal(done.js, whole.sums.js)
    for name in FEATURES:
        assert np.array_equal(done.features[name], whole.sums.features[name])
    assert whole.syntax is not None and meta["syntax"] == whole.syntax.to_dict()
