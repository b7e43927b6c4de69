"""The session's pinned helm (built with the control plane by e2e/cluster/build.sh) and promtool
(e2e/cluster/build-prometheus.sh, `make prometheus-bin`)."""

from __future__ import annotations

import pytest
from e2e.cluster.controlplane import build_binaries
from e2e.promtool import Promtool, PromtoolMissing

from .chart_helpers import Helm


@pytest.fixture(scope="session")
def helm() -> Helm:
    return Helm(str(build_binaries() / "helm"))


@pytest.fixture(scope="session")
def promtool() -> Promtool:
    """Never skipped: `make test` builds promtool first; a bare pytest says how to."""
    try:
        return Promtool.locate()
    except PromtoolMissing as err:
        missing = str(err)
    pytest.fail(missing, pytrace=False)
