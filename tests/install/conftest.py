"""The session's pinned helm (built with the control plane by e2e/cluster/build.sh)."""

from __future__ import annotations

import pytest
from e2e.cluster.controlplane import build_binaries

from .chart_helpers import Helm


@pytest.fixture(scope="session")
def helm() -> Helm:
    return Helm(str(build_binaries() / "helm"))
