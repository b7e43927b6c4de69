"""Steady state writes nothing: reconcile passes and remediation cycles over an unchanged
deployment leave its status (and resourceVersion) alone.

Both write the same status object, each its own conditions. If one writer's pass reordered the
other's conditions, every pass would be a status write and a watch event for every client, at
fleet scale a stream of PATCHes that never ends (bench/fleet.py found 0.4 per second per
deployment before conditions kept their place).
"""

from __future__ import annotations

import asyncio

from shell_fakes import KubeFake, WorkerFake, cluster, pddeployment

from pdwarden.constants import KIND
from pdwarden.handlers.on_deployment import OperatorState, reconcile_now, remediation_cycle
from pdwarden.k8s.cache import CACHED_KINDS, ObjectCache
from pdwarden.k8s.cached import CachedKube
from pdwarden.remediation.record.store import compare_versions


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


def test_a_body_that_lags_our_own_write_costs_no_read_and_a_newer_one_wins() -> None:
    """kopf's body lags our status writes by a watch event (seconds, at fleet scale). The cycle
    must neither GET the object to bridge that lag (bench/fleet.py measured 26 GETs/s over 200
    deployments when it did) nor trust its own copy over a newer body."""
    kube, workers = KubeFake(), WorkerFake()
    cluster(kube)
    state = OperatorState(client=kube, workers=workers, token_key=b"k" * 32)
    stale = kube.obj(KIND, "ns", "pd")
    asyncio.run(reconcile_now(state, stale, force_apply=False))
    written = kube.obj(KIND, "ns", "pd")["metadata"]["resourceVersion"]
    assert written != stale["metadata"]["resourceVersion"]  # `stale` now lags our write
    gets = kube.calls["get"]
    asyncio.run(remediation_cycle(state, stale))
    asyncio.run(reconcile_now(state, stale, force_apply=False))
    assert kube.calls["get"] == gets

    # Another writer (an older replica's ledger entry, say) writes after us: its body is newer.
    obj = kube.obj(KIND, "ns", "pd")
    obj["status"]["phase"] = "Failed"
    newer = kube.put(obj)
    uid = newer["metadata"]["uid"]
    assert asyncio.run(state.statuses.current(newer)).status.phase == "Failed"
    assert state.statuses.entries[uid].resource_version == newer["metadata"]["resourceVersion"]
    assert kube.calls["get"] == gets


def test_resource_versions_order_as_kep_5504_says_and_others_are_not_ordered() -> None:
    assert compare_versions("9", "10") == -1  # by length first, not as strings
    assert compare_versions("123", "122") == 1
    assert compare_versions("77", "77") == 0
    for odd in (None, "", "012", "12a", "-3", " 12"):
        assert compare_versions(odd, "12") is None and compare_versions("12", odd) is None


def test_a_created_deployment_is_applied_once_although_the_watch_has_not_caught_up() -> None:
    """The create pass applies everything; the resync daemon's first pass follows ~1 s later,
    before the watch has delivered the new StatefulSets. It must see them anyway (the cache
    folds in what our own applies returned) and apply nothing: bench/fleet.py found every
    created deployment applied twice, doubling the reconcile side's cost at create."""
    kube = KubeFake()
    pdd = pddeployment(kube)
    cache = ObjectCache()
    for _, kind in CACHED_KINDS:
        cache.replace(kind, "", [])  # listed (empty) before the deployment existed; no watch
    state = OperatorState(client=CachedKube(kube, cache), token_key=b"k" * 32)  # type: ignore[arg-type]
    asyncio.run(reconcile_now(state, pdd, force_apply=True))
    created = kube.calls["apply"]
    assert created and cache.size()["StatefulSet"] == 2
    asyncio.run(reconcile_now(state, kube.obj(KIND, "ns", "pd"), force_apply=False))
    assert kube.calls["apply"] == created
