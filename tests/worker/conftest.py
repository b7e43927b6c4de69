"""The `pd` fixture: a fresh set of pdworker processes per test, all killed in teardown."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pdharness import PD


@pytest.fixture
def pd(tmp_path: Path) -> Iterator[PD]:
    harness = PD(tmp_path)
    try:
        yield harness
    finally:
        harness.close()
