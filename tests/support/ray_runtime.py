"""One local Ray runtime for every Ray test (start-up is slow): import `ray_runtime` into a conftest or test module.

Asking for it marks a test `ray` (tests/conftest.py's MARKED_FIXTURES). Each module that imports it holds its own
session fixture; the first one started owns the runtime and shuts it down at the end, the others reuse it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session")
def ray_runtime() -> Iterator[object]:
    ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install 'attnscope[ray]')")
    if ray.is_initialized():  # another module's fixture started it
        yield ray
        return
    ray.init(address="local", num_cpus=2, include_dashboard=False, object_store_memory=96 * 2**20, log_to_driver=False,
             logging_level=logging.WARNING)
    try:
        yield ray
    finally:
        ray.shutdown()
