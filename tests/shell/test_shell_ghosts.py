"""Objects deleted while the operator was not watching: nothing is written for them again.

kopf learns of a deletion from a DELETED watch event, or from a deletionTimestamp its finalizer
holds. An object whose finalizer was released by hand while the operator was down (or whose
DELETED event was compacted away) is missing from the list kopf makes after 410 Gone, and a list
says what exists, not what vanished: kopf never stops that object's daemons. These passes and
cycles run with such a ghost's last body (e2e twin: test_control_plane_faults.py, watch history
compacted).
"""

from __future__ import annotations

import asyncio

from shell_fakes import KubeFake, WorkerFake, cluster, pddeployment

from pdwarden.constants import KIND
from pdwarden.handlers.on_deployment import (
    OperatorState,
    is_gone,
    reconcile_now,
    remediation_cycle,
)

KEY = b"k" * 32


def collect(kube: KubeFake, deployment: str = "pd") -> None:
    """Delete the PDDeployment and what the garbage collector deletes after it."""
    for key in [k for k in kube.objects if k[0] == KIND and k[2] == deployment]:
        del kube.objects[key]
    for key, obj in list(kube.objects.items()):
        if obj["metadata"]["name"].startswith(f"{deployment}-"):
            del kube.objects[key]


def test_a_resync_pass_for_a_deleted_deployment_recreates_nothing_and_ends_its_daemons() -> None:
    kube = KubeFake()
    pddeployment(kube)
    state = OperatorState(client=kube, workers=WorkerFake(), token_key=KEY)
    asyncio.run(reconcile_now(state, kube.obj(KIND, "ns", "pd"), force_apply=True))
    assert kube.kinds("StatefulSet")
    ghost = kube.obj(KIND, "ns", "pd")  # kopf's last body of it
    collect(kube)

    # The resync daemon's pass (the cache saw the children go): before the fix it applied them
    # all again, owned by an object that no longer exists.
    result = asyncio.run(reconcile_now(state, ghost, force_apply=False))
    assert result.applied == []
    assert not [key for key in kube.objects if key[0] != "Event"], kube.objects.keys()
    assert is_gone(state, ghost)
    applies = kube.calls["apply"]
    asyncio.run(reconcile_now(state, ghost, force_apply=False))
    assert kube.calls["apply"] == applies


def test_a_deployment_recreated_under_its_name_is_another_object() -> None:
    kube = KubeFake()
    pddeployment(kube)
    state = OperatorState(client=kube, workers=WorkerFake(), token_key=KEY)
    asyncio.run(reconcile_now(state, kube.obj(KIND, "ns", "pd"), force_apply=True))
    ghost = kube.obj(KIND, "ns", "pd")
    collect(kube)
    pddeployment(kube)  # same name, a new uid: kopf runs its own daemons for it
    asyncio.run(reconcile_now(state, ghost, force_apply=False))
    owners = {
        ref["uid"]
        for obj in kube.kinds("StatefulSet")
        for ref in obj["metadata"].get("ownerReferences") or []
    }
    assert ghost["metadata"]["uid"] not in owners
    assert is_gone(state, ghost)


def test_a_remediation_daemon_of_a_deleted_deployment_stops_scraping_its_orphans() -> None:
    """Deleted with --cascade=orphan: its pods run on, wedged. The daemon may not act on them
    (every action needs its intent written to the object, answered 404) and stops after the
    cycle that found the object gone, instead of scraping them forever."""
    kube, workers = KubeFake(), WorkerFake()
    cluster(kube)
    state = OperatorState(client=kube, workers=workers, admin=workers, token_key=KEY)
    ghost = kube.obj(KIND, "ns", "pd")
    del kube.objects[(KIND, "ns", "pd")]  # the pods and StatefulSets stay (orphaned)
    workers.stuck("pd-prefill-0", "pd-decode-1", 11, 12)
    asyncio.run(remediation_cycle(state, ghost))
    assert workers.failed == {}  # never acted on
    assert is_gone(state, ghost)
    scraped = len(workers.scraped)
    for _ in range(3):
        asyncio.run(remediation_cycle(state, ghost))
    assert len(workers.scraped) == scraped, "the deleted deployment's pods are still scraped"
    assert workers.failed == {}
