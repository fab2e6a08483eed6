"""One local Ray runtime for every Ray test (start-up is slow): import `ray_runtime` into a conftest or test module.

Asking for it marks a test `ray` (tests/conftest.py's MARKED_FIXTURES). Each module that imports it holds its own
session fixture; the first one started owns the runtime and shuts it down at the end, the others reuse it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

# Room for a few shipped MiniLMs (~91 MB each: every run puts the driver's model once): at 96 MB each run spilled the
# previous one to disk (~1 GB written per session at ~100 MB/s). Shared memory is taken only as objects are stored.
STORE_BYTES = 384 * 2**20


@pytest.fixture(scope="session")
def ray_runtime() -> Iterator[object]:
    ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install 'attnscope[ray]')")
    if ray.is_initialized():  # another module's fixture started it
        yield ray
        return
    ray.init(address="local", num_cpus=2, include_dashboard=False, object_store_memory=STORE_BYTES,
             log_to_driver=False, logging_level=logging.WARNING)
    try:
        yield ray
    finally:
        ray.shutdown()
