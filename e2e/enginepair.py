"""One real engine pair (a PDDeployment of stock prefill/decode pods) for an engine tier.

Why: the vLLM and SGLang tiers deploy their pair the same way: a namespace and an operator of
their own, the pods Ready within the engine's startup window, then a preflight of PD requests
sent straight to the pods (a pair that cannot move KV is the rig's fault, never pdwarden's, and
every scenario would fail for it in its own way: the tier errors at once, naming why). Only the
spec, the preflight and the startup window differ, and they come in as arguments.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from e2e.fixtures import Cluster, OperatorProcess, create_namespace, release_pddeployments
from e2e.pdtools import apply, pods, router_url, wait_ready

# The pods' IPs (prefill, decode) -> why the pair cannot serve the tier ("" when it can).
Preflight = Callable[[str, str], str]


def preflight_rounds(
    request: Callable[[str], object], engine: str, rounds: int, concurrent: int, seconds: float
) -> str:
    """Why the pair cannot serve ("" when it can): `rounds` rounds of `concurrent` PD requests
    at once (`request(text)` sends one straight to the pods, raising if it fails), each round
    answered within `seconds`."""
    for r in range(rounds):
        failures: list[str] = []

        def one(i: int, r: int = r, failures: list[str] = failures) -> None:
            try:
                request(f"preflight {r}.{i}")
            except Exception as exc:  # a timeout is the engine's hang; anything else too
                failures.append(f"{type(exc).__name__}: {exc}"[:300])

        threads = [threading.Thread(target=one, args=(i,)) for i in range(concurrent)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + seconds
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        failures += ["no answer at all"] * sum(t.is_alive() for t in threads)
        if failures:
            return (
                f"the stock {engine} pair cannot move KV: in round {r + 1} of {rounds}, "
                f"{len(failures)} of {concurrent} PD requests sent straight to the pods failed "
                f"({failures[0]}); see e2e/{engine.lower()}/fixtures.py"
            )
    return ""


@dataclass
class EnginePair:
    cluster: Cluster
    namespace: str
    operator: OperatorProcess
    started_seconds: float
    name: str = "pd"

    def pod(self, role: str) -> dict[str, Any]:
        (pod,) = [
            p for p in pods(self.cluster, self.namespace, role, self.name)
            if not p["metadata"].get("deletionTimestamp")
        ]  # fmt: skip
        return pod

    def ip(self, role: str) -> str:
        return str(self.pod(role)["status"].get("podIP", ""))

    @property
    def router(self) -> str:
        return router_url(self.cluster, self.namespace, self.name)


@contextlib.contextmanager
def deployed(
    cluster: Cluster,
    doc: dict[str, Any],
    prefix: str,
    log: Path,
    *,
    startup_seconds: float,
    preflight: Preflight,
    wait_gone: float = 0,
) -> Iterator[EnginePair]:
    """The PDDeployment `doc` in a namespace of its own with an operator of its own, its pair
    Ready and able to serve (`preflight`), all deleted afterwards; with `wait_gone`, waits (that
    long at most) until its pods are gone, so the next tier starts on free cores."""
    ns = create_namespace(cluster, prefix)
    operator = OperatorProcess(cluster, [ns], log).start()
    name = str(doc["metadata"]["name"])
    t0 = time.monotonic()
    apply(cluster, ns, doc)
    try:
        wait_ready(cluster, ns, {"prefill": "1/1", "decode": "1/1"}, startup_seconds, name)
        pair = EnginePair(cluster, ns, operator, time.monotonic() - t0, name)
        print(f"[{prefix}] pair {name} Ready in {pair.started_seconds:.0f}s (namespace {ns})",
              file=sys.stderr)  # fmt: skip
        broken = preflight(pair.ip("prefill"), pair.ip("decode"))
        if broken:
            pytest.fail(broken, pytrace=False)
        yield pair
    finally:
        operator.stop()
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        release_pddeployments(cluster, ns)
        if wait_gone:
            wait_pods_gone(cluster, ns, wait_gone)


def wait_pods_gone(cluster: Cluster, ns: str, timeout: float) -> None:
    """Until the namespace has no pod left (a deleted pair's processes are gone)."""

    def gone() -> bool:
        out = cluster.kubectl("get", "pods", "-n", ns, "-o", "name", check=False)
        return not out.stdout.strip()

    cluster.wait_until(f"the pods of namespace {ns} gone", gone, timeout)
