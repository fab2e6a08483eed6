"""One local Ray runtime for the module's tests (start-up is slow), and the local engine's numbers to match."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import attnscope
from attnscope.stats import RunResult, Source, run
from tests.support.distributed import SETTINGS
from tests.support.ray_runtime import ray_runtime  # noqa: F401 (the shared Ray runtime fixture)


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread(one_torch_thread: None) -> None:
    """Every test here on one torch thread (tests/conftest.py's fixture)."""


@pytest.fixture(scope="session")
def local_result(minilm: attnscope.Model, ud_dev: Path, tmp_path_factory: pytest.TempPathFactory) -> RunResult:
    """The local engine on the same slice and settings: what every Ray run must equal. On one torch thread, as
    each worker here: a session fixture runs before the module's one_torch_thread, and float32 matmuls may round
    differently on another number of threads."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return run(Source(str(ud_dev)), minilm, SETTINGS, tmp_path_factory.mktemp("local") / "out")
    finally:
        torch.set_num_threads(before)
