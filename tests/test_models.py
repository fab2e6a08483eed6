"""Loading models: the bundled default, local checkpoints, loaded objects, and fast offline failure."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

import attnscope
from attnscope.errors import AttnscopeError
from attnscope.models import bundled_model_path


def test_default_model_is_the_bundled_minilm(minilm: attnscope.Model) -> None:
    assert minilm.name == "all-MiniLM-L6-v2"
    assert (minilm.architecture, minilm.n_layers, minilm.n_heads) == ("BertModel", 6, 12)
    assert minilm.model.config._attn_implementation == "eager"
    assert attnscope.load_model() is minilm  # loaded once per process
    assert attnscope.load_model("sentence-transformers/all-MiniLM-L6-v2") is minilm


def test_a_local_checkpoint_directory_loads(minilm: attnscope.Model) -> None:
    m = attnscope.load_model(str(bundled_model_path()))
    assert m.name == str(bundled_model_path()) and m.n_layers == 6
    tr = attnscope.trace("hello world", model=m)
    assert tr.check().ok


def test_an_already_loaded_model_is_used_as_is(minilm: attnscope.Model) -> None:
    m = attnscope.load_model(minilm.model)
    assert m.model is minilm.model and m.tokenizer is not None


def test_a_directory_without_config_is_refused(tmp_path: Path) -> None:
    with pytest.raises(AttnscopeError, match=r"has no config\.json"):
        attnscope.load_model(str(tmp_path))


def test_unavailable_model_fails_fast_naming_it() -> None:
    code = ("import attnscope, time\n"
            "t = time.time()\n"
            "try:\n"
            "    attnscope.load_model('no-such-org/no-such-model')\n"
            "except attnscope.AttnscopeError as e:\n"
            "    print(round(time.time() - t, 1), e)\n")
    start = time.time()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "no-such-org/no-such-model" in out.stdout and "not available offline" in out.stdout, out.stderr
    seconds = float(out.stdout.split()[0])
    assert seconds < 20, f"no retries: took {seconds}s in load_model (whole process {time.time() - start:.1f}s)"
