"""The `pd` fixture: a fresh set of pdworker processes per test, all killed in teardown.

The processes come from `bench.harness` (shared with the benchmarks), each with its SMALL model
and waited for until ready.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from bench.harness import SMALL, Workers

# On CUDA, cuBLAS results are bit-reproducible across streams only with a fixed workspace; the
# workers (which inherit this environment) compute on side streams, tests on the default one,
# and test_integrity compares their KV bytes exactly. No effect on CPU.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


@pytest.fixture
def pd(tmp_path: Path) -> Iterator[Workers]:
    harness = Workers(tmp_path, flags=SMALL, wait=True)
    try:
        yield harness
    finally:
        harness.close()
