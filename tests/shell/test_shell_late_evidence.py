"""No action on old evidence: a cycle whose intent write the API server answered late does not
carry out its decision.

While etcd stalls, the API server holds writes until it returns or the client gives up (15 s):
a cycle that looked at its pods, then waited that long for its intent to be recorded, would act
on what it saw then, though the pods may have changed meanwhile (the wedged process died and was
restarted, say). The intent stays the ledger's (completed Skipped, no Event); the next cycle
looks again and acts on what it sees. e2e twin: test_control_plane_faults.py, etcd paused.
"""

from __future__ import annotations

import asyncio
from typing import Any

from shell_fakes import KubeFake, WorkerFake, cluster

from pdwarden.constants import KIND
from pdwarden.handlers.on_deployment import OperatorState, remediation_cycle
from pdwarden.remediation.cycle import evidence_limit

KEY = b"k" * 32


class SlowIntents(KubeFake):
    """An API server that holds the first status write carrying an intent (a Pending ledger
    entry) for `delay` seconds before it applies it, as one does while etcd is stopped."""

    delay: float = 0.0

    async def patch_status(
        self, api_version: str, kind: str, namespace: str, name: str, status: dict[str, Any],
        *, resource_version: str | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        history = (status.get("remediation") or {}).get("history") or []
        if self.delay and any(e.get("outcome") == "Pending" for e in history):
            delay, self.delay = self.delay, 0.0
            await asyncio.sleep(delay)
        return await super().patch_status(
            api_version, kind, namespace, name, status, resource_version=resource_version
        )


def ledger(kube: KubeFake) -> list[dict[str, Any]]:
    status = kube.obj(KIND, "ns", "pd").get("status") or {}
    return list((status.get("remediation") or {}).get("history") or [])


def test_an_intent_recorded_late_is_not_carried_out_and_the_next_cycle_decides_again() -> None:
    kube, workers = SlowIntents(), WorkerFake()
    cluster(kube)  # scrapeIntervalSeconds 1
    workers.stuck("pd-prefill-0", "pd-decode-1", 11)
    workers.stuck("pd-prefill-1", "pd-decode-1", 21)
    state = OperatorState(client=kube, workers=workers, admin=workers, token_key=KEY)
    kube.delay = evidence_limit(1) + 0.5

    asyncio.run(remediation_cycle(state, kube.obj(KIND, "ns", "pd")))
    assert workers.failed == {}, "acted on evidence older than the limit"
    [late] = ledger(kube)  # the second action was not even intended: its evidence was as old
    assert (late["action"], late["outcome"]) == ("FailRooms", "Skipped")
    assert "old once its intent was recorded" in late["reason"]
    assert not [e for e in kube.events if e["reason"] == "FailRooms"]

    asyncio.run(remediation_cycle(state, kube.obj(KIND, "ns", "pd")))  # answered at once now
    assert workers.failed == {"pd-prefill-0": [11], "pd-prefill-1": [21]}
    done = [(e["pod"], e["outcome"]) for e in ledger(kube) if e["action"] == "FailRooms"]
    assert sorted(done) == [
        ("pd-prefill-0", "Skipped"),
        ("pd-prefill-0", "Succeeded"),
        ("pd-prefill-1", "Succeeded"),
    ]
    assert len([e for e in kube.events if e["reason"] == "FailRooms"]) == 4  # deployment + pod
