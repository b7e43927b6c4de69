"""Steady state writes nothing: reconcile passes and remediation cycles over an unchanged
deployment leave its status (and resourceVersion) alone.

Both write the same status object, each its own conditions. If one writer's pass reordered the
other's conditions, every pass would be a status write and a watch event for every client, at
fleet scale a stream of PATCHes that never ends (bench/fleet.py found 0.4 per second per
deployment before conditions kept their place).
"""

from __future__ import annotations

import asyncio

from shell_fakes import KubeFake, WorkerFake, cluster

from pdwarden.constants import KIND
from pdwarden.handlers.deployment import OperatorState, reconcile_now, remediation_cycle


def test_alternating_reconcile_and_remediation_settle_without_writes() -> None:
    kube, workers = KubeFake(), WorkerFake()
    cluster(kube)
    state = OperatorState(client=kube, workers=workers, token_key=b"k" * 32)

    def rv() -> str:
        return str(kube.obj(KIND, "ns", "pd")["metadata"]["resourceVersion"])

    async def rounds(n: int) -> list[str]:
        seen = []
        for _ in range(n):
            await reconcile_now(state, kube.obj(KIND, "ns", "pd"), force_apply=False)
            await remediation_cycle(state, kube.obj(KIND, "ns", "pd"))
            seen.append(rv())
        return seen

    asyncio.run(rounds(2))  # the first passes write what they observed
    settled = rv()
    assert asyncio.run(rounds(4)) == [settled] * 4
    conditions = kube.obj(KIND, "ns", "pd")["status"]["conditions"]
    assert {c["type"] for c in conditions} >= {"Ready", "Degraded", "Wedged"}
