"""What a replica that dies while acting leaves behind, completed by the next one (issue 28).

In-process, over the fakes: the status holds what a dead replica wrote (a Pending entry, the
intent it persists before acting) and the pods show how far it got; a fresh OperatorState (a
standby that just took over: no memory) runs cycles. The e2e twin kills a real replica with
SIGKILL at each point (e2e/tests/test_ledger_failover.py); here every outcome is set up exactly.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from shell_fakes import KubeFake, WorkerFake, cluster

from pdwarden.api import LedgerEntry
from pdwarden.constants import CONDITION_SERVING, KIND
from pdwarden.handlers.on_deployment import OperatorState, remediation_cycle
from pdwarden.remediation.act.pod_condition import CORDONED, MESSAGE_PREFIX
from pdwarden.remediation.events import event_name
from pdwarden.remediation.recovery import SETTLE_AFTER

KEY = b"k" * 32
ID = "0123456789ab"


def stamp(t: datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


def decided(seconds_ago: float) -> datetime:
    return (datetime.now(UTC) - timedelta(seconds=seconds_ago)).replace(microsecond=0)


def pending(kube: KubeFake, action: str, pod: str, at: datetime, **more: Any) -> dict[str, Any]:
    """The dead replica's intent, as it wrote it to the status before acting."""
    uid = (
        kube.obj("Pod", "ns", pod)["metadata"]["uid"] if ("Pod", "ns", pod) in kube.objects else ""
    )
    entry = {"id": ID, "time": stamp(at), "action": action, "pod": pod, "reason": "decode stalled",
             "outcome": "Pending", "uid": more.pop("uid", uid), **more}  # fmt: skip
    kube.objects[(KIND, "ns", "pd")]["status"] = {"remediation": {"history": [entry]}}
    return entry


def cordon_shown(kube: KubeFake, pod: str, at: datetime) -> None:
    """The pod as the dead replica left it after cordoning it."""
    conditions = kube.objects[("Pod", "ns", pod)]["status"]["conditions"]
    conditions[:] = [c for c in conditions if c["type"] != CONDITION_SERVING] + [
        {"type": CONDITION_SERVING, "status": "False", "reason": CORDONED,
         "message": f"{MESSAGE_PREFIX}decode stalled", "lastTransitionTime": stamp(at)}
    ]  # fmt: skip


def standby(kube: KubeFake, workers: WorkerFake) -> OperatorState:
    return OperatorState(client=kube, workers=workers, admin=workers, token_key=KEY)


def cycle(state: OperatorState, kube: KubeFake) -> None:
    asyncio.run(remediation_cycle(state, kube.obj(KIND, "ns", "pd")))


def remediation(kube: KubeFake) -> dict[str, Any]:
    return dict((kube.obj(KIND, "ns", "pd").get("status") or {}).get("remediation") or {})


def entries(kube: KubeFake) -> list[tuple[str, str, str]]:
    return [(e["action"], e["pod"], e["outcome"]) for e in remediation(kube).get("history", [])]


def action_events(kube: KubeFake, reason: str) -> list[dict[str, Any]]:
    return [e for e in kube.events if e["reason"] == reason]


@pytest.fixture
def kube() -> KubeFake:
    k = KubeFake()
    cluster(k)
    return k


def test_an_intent_whose_action_never_ran_is_settled_as_not_performed(
    kube: KubeFake,
) -> None:
    pending(kube, "CordonDecode", "pd-decode-1", decided(30))
    state = standby(kube, WorkerFake())
    cycle(state, kube)
    assert entries(kube) == [("CordonDecode", "pd-decode-1", "Skipped")]
    [entry] = remediation(kube)["history"]
    assert entry["id"] == ID and "not performed" in entry["reason"]
    assert remediation(kube)["actionsLastHour"] == 0  # nothing was done: nothing is counted
    assert action_events(kube, "CordonDecode") == []


@pytest.mark.parametrize("event_posted", [False, True], ids=["killed-after-action", "after-event"])
def test_an_action_that_ran_is_recorded_once_with_one_event(
    kube: KubeFake, event_posted: bool
) -> None:
    at = decided(30)
    pending(kube, "CordonDecode", "pd-decode-1", at)
    cordon_shown(kube, "pd-decode-1", at)
    if event_posted:  # the dead replica got as far as its Event on the PDDeployment
        body = kube.obj(KIND, "ns", "pd")
        posted = LedgerEntry.model_validate(
            {"id": ID, "time": at, "action": "CordonDecode", "pod": "pd-decode-1"}
        )
        kube.events.append({
            "metadata": {"name": event_name("pd", posted)},
            "reason": "CordonDecode",
            "involvedObject": {"uid": body["metadata"]["uid"]},
        })  # fmt: skip
    state = standby(kube, WorkerFake())
    cycle(state, kube)
    cycle(state, kube)
    assert entries(kube) == [("CordonDecode", "pd-decode-1", "Succeeded")]
    assert "recovered after a failover" in remediation(kube)["history"][0]["reason"]
    assert remediation(kube)["actionsLastHour"] == 1
    pdd_uid = kube.obj(KIND, "ns", "pd")["metadata"]["uid"]
    on_pdd = [e for e in action_events(kube, "CordonDecode")
              if e["involvedObject"]["uid"] == pdd_uid]  # fmt: skip
    assert len(on_pdd) == 1


def test_a_young_pending_entry_waits_and_holds_back_new_actions_on_its_pod(
    kube: KubeFake,
) -> None:
    young = SETTLE_AFTER.total_seconds() / 2
    pending(kube, "FailRooms", "pd-prefill-0", decided(young), roomIds=[11], peer="pd-decode-1")
    workers = WorkerFake()
    workers.stuck("pd-prefill-0", "pd-decode-1", 11)
    state = standby(kube, workers)
    cycle(state, kube)
    assert workers.failed == {}  # neither settled (too young) nor acted on again
    assert entries(kube) == [("FailRooms", "pd-prefill-0", "Pending")]
    suspended = next(
        c for c in kube.obj(KIND, "ns", "pd")["status"]["conditions"]
        if c["type"] == "RemediationSuspended"
    )  # fmt: skip
    assert "still Pending" in suspended["message"]


def test_a_pending_fail_rooms_is_completed_by_asking_again(kube: KubeFake) -> None:
    pending(kube, "FailRooms", "pd-prefill-0", decided(30), roomIds=[11, 12], rooms=2,
            peer="pd-decode-1")  # fmt: skip
    workers = WorkerFake()
    workers.stuck("pd-prefill-0", "pd-decode-1", 12)  # 11 was failed before the replica died
    cycle(standby(kube, workers), kube)
    assert workers.failed == {"pd-prefill-0": [12]}
    [entry] = remediation(kube)["history"]
    assert (entry["outcome"], entry["rooms"]) == ("Succeeded", 1)
    assert "roomIds" not in entry and "failed 1 of 2 rooms now" in entry["reason"]


@pytest.mark.parametrize("replaced", [True, False])
def test_a_pending_restart_is_read_from_the_pod_incarnation(kube: KubeFake, replaced: bool) -> None:
    pod = kube.objects[("Pod", "ns", "pd-decode-1")]
    pending(kube, "RestartDecode", "pd-decode-1", decided(30), uid=pod["metadata"]["uid"])
    if replaced:
        pod["metadata"]["uid"] = "the-new-incarnation"
    cycle(standby(kube, WorkerFake()), kube)
    assert entries(kube) == [
        ("RestartDecode", "pd-decode-1", "Succeeded" if replaced else "Skipped")
    ]


def test_a_cordon_on_the_pods_without_an_entry_is_reconstructed_once(kube: KubeFake) -> None:
    cordon_shown(kube, "pd-decode-0", decided(120))
    state = standby(kube, WorkerFake())
    cycle(state, kube)
    cycle(state, kube)
    assert entries(kube) == [("CordonDecode", "pd-decode-0", "Succeeded")]
    assert "recovered" in remediation(kube)["history"][0]["reason"]
    cycle(standby(kube, WorkerFake()), kube)  # another takeover: it is in the ledger now
    assert len(entries(kube)) == 1
