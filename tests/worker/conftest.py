"""The `pd` fixture: a fresh set of pdworker processes per test, all killed in teardown."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from pdharness import PD

# On CUDA, cuBLAS results are bit-reproducible across streams only with a fixed workspace; the
# workers (which inherit this environment) compute on side streams, tests on the default one,
# and test_integrity compares their KV bytes exactly. No effect on CPU.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


@pytest.fixture
def pd(tmp_path: Path) -> Iterator[PD]:
    harness = PD(tmp_path)
    try:
        yield harness
    finally:
        harness.close()
