"""The vLLM tier's session fixture: ONE real PDDeployment (engine vllm) per test session.

Why once: a real `vllm serve` costs ~3 GB PSS and minutes to start on two busy cores, so the
pair is deployed the first time a `vllm` test asks for it and shared by every scenario after it,
with one operator process (Enforce) watching its namespace. A scenario that kills or freezes an
engine restores it (or lets pdwarden or the kubelet restart it) before it ends. The venv is built
(or reused) first; only if it cannot be built are the tests skipped, with the build's error as
the reason.
The pair's start-up time is printed for the tier's cost accounting.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from e2e.fixtures import Cluster, OperatorProcess, create_namespace, release_pddeployments
from e2e.pdtools import apply, pods, router_url, wait_ready
from e2e.vllm import cache_root, ensure_venv
from e2e.vllm.pods import STARTUP_SECONDS, pd_deployment
from e2e.vllm.tinymodel import ensure_model

NAME = "pd"
# Scrapes every 2 s; a wedge is a window of 45 s: under healthy load on two busy cores a real
# vLLM read was measured to take up to 21 s, and a decode step up to ~28 s.
SCRAPE, WEDGE_AFTER = 2, 45
# Enforce with every action (RestartPrefill is opt-in and needs AbortRequests listed): healthy
# scenarios must draw none, a frozen engine its repair only. A frozen decode is restarted
# RESTART_AFTER seconds after its cordon; a restarted pod cold-starts in minutes here, during
# which it is not ready or stale, and nothing is done to a pod in either state.
ACTIONS = ["FailRooms", "CordonDecode", "RestartDecode", "AbortRequests", "RestartPrefill"]
RESTART_AFTER = 90


@dataclass
class VllmPD:
    cluster: Cluster
    namespace: str
    operator: OperatorProcess
    started_seconds: float

    def pod(self, role: str) -> dict[str, Any]:
        (pod,) = [
            p for p in pods(self.cluster, self.namespace, role, NAME)
            if not p["metadata"].get("deletionTimestamp")
        ]  # fmt: skip
        return pod

    def ip(self, role: str) -> str:
        return str(self.pod(role)["status"].get("podIP", ""))

    @property
    def router(self) -> str:
        return router_url(self.cluster, self.namespace, NAME)


@dataclass(frozen=True)
class VllmModel:
    venv: Path
    path: Path  # the tiny model's directory


@pytest.fixture(scope="session")
def vllm_model() -> VllmModel:
    """The stock vLLM venv and the tiny model, built once (skips the tier if they cannot be)."""
    try:
        venv = ensure_venv()
    except (RuntimeError, OSError) as exc:
        pytest.skip(f"the stock vLLM venv cannot be built here (make vllm-venv): {exc}")
    return VllmModel(venv, ensure_model(venv, cache_root()))


@pytest.fixture(scope="session")
def vllm_pd(
    cluster: Cluster, crd: str, vllm_model: VllmModel, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VllmPD]:
    model = vllm_model.path
    ns = create_namespace(cluster, "vllm")
    log = Path(tmp_path_factory.mktemp("vllm")) / "operator.log"
    operator = OperatorProcess(cluster, [ns], log).start()
    t0 = time.monotonic()
    doc = pd_deployment(
        str(model), NAME, mode="Enforce", actions=ACTIONS, scrapeIntervalSeconds=SCRAPE,
        wedgeAfterSeconds=WEDGE_AFTER, restartAfterSeconds=RESTART_AFTER,
    )  # fmt: skip
    apply(cluster, ns, doc)
    try:
        wait_ready(cluster, ns, {"prefill": "1/1", "decode": "1/1"}, STARTUP_SECONDS, NAME)
        pd = VllmPD(cluster, ns, operator, time.monotonic() - t0)
        print(f"[vllm] pair Ready in {pd.started_seconds:.0f}s (namespace {ns})", file=sys.stderr)
        yield pd
    finally:
        operator.stop()
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        release_pddeployments(cluster, ns)
