"""HA failover in-process: two operator replicas take turns on one PDDeployment; no ledger entry
is ever lost (issue 13 item 5).

Each replica has its own memory (the status cache that once won over the object's status). In
the `lagging` variant each replica's view of the object is what its watch last showed, its own
last write, so it trusts its cache, computes from a stale ledger, and its resourceVersion-guarded
write is refused with 409 (`KubeFake` answers as the API server does); the write must then merge
instead of replacing the ledger. Reconcile passes of the other replica are interleaved, as both
kinds of writer run in each process.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from prometheus_client import REGISTRY
from shell_fakes import KubeFake, WorkerFake, cluster

from pdwarden.constants import KIND
from pdwarden.handlers.on_deployment import OperatorState, reconcile_now, remediation_cycle

KEY = b"k" * 32
ROUNDS = 8


def conflicts() -> float:
    return REGISTRY.get_sample_value("pdwarden_status_conflicts_total") or 0.0


def ledger(kube: KubeFake) -> list[dict[str, Any]]:
    rem = (kube.obj(KIND, "ns", "pd").get("status") or {}).get("remediation") or {}
    return list(rem.get("history") or [])


@pytest.mark.parametrize("lagging", [False, True])
def test_two_replicas_alternating_never_lose_a_ledger_entry(lagging: bool) -> None:
    kube, workers = KubeFake(), WorkerFake()
    cluster(kube, maxActionsPerHour=1000, actions=["FailRooms"])
    replicas = [
        OperatorState(client=kube, workers=workers, admin=workers, token_key=KEY) for _ in range(2)
    ]
    seen: dict[int, dict[str, Any]] = {}  # what each replica's watch last showed
    start = conflicts()

    def body_for(i: int) -> dict[str, Any]:
        return seen[i] if lagging and i in seen else kube.obj(KIND, "ns", "pd")

    for n in range(ROUNDS):
        active, other = n % 2, (n + 1) % 2
        rooms = range(100 * n, 100 * n + n + 1)  # n+1 rooms: every round's entry differs
        workers.stuck("pd-prefill-0", "pd-decode-1", *rooms)
        asyncio.run(remediation_cycle(replicas[active], body_for(active)))
        seen[active] = kube.obj(KIND, "ns", "pd")
        asyncio.run(reconcile_now(replicas[other], body_for(other), force_apply=False))
        seen[other] = kube.obj(KIND, "ns", "pd")
        entries = ledger(kube)
        assert [e["rooms"] for e in entries] == list(range(1, n + 2)), (n, entries)
    assert sum(len(v) for v in workers.failed.values()) == sum(range(1, ROUNDS + 1))
    status = kube.obj(KIND, "ns", "pd")["status"]
    assert status["remediation"]["actionsLastHour"] >= ROUNDS - 1
    assert status["observedGeneration"] == 1  # reconcile's fields survive remediation's writes
    if lagging:
        assert conflicts() > start  # the guarded write was refused and merged, not forced
