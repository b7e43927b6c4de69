"""Realistic PDDeployment objects for the status view, built from the API models so the wire
names can never drift from what the operator writes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from pdwarden.api import (
    CanaryTally,
    Condition,
    CordonRecord,
    DecodeStatus,
    LedgerEntry,
    PDDeploymentStatus,
    RemediationStatus,
    RoleStatus,
    WedgeFinding,
    status_to_wire,
)

NOW = datetime(2025, 6, 1, 12, 0, 0, tzinfo=UTC)


def at(seconds_ago: float) -> datetime:
    return NOW - timedelta(seconds=seconds_ago)


def _meta(name: str, generation: int) -> dict[str, Any]:
    return {"name": name, "namespace": "serving", "generation": generation, "uid": "u-1"}


def _spec(mode: str = "Enforce") -> dict[str, Any]:
    return {
        "engine": "pdworker",
        "prefill": {"replicas": 2},
        "decode": {"replicas": 4},
        "router": {"replicas": 1},
        "remediation": {"mode": mode, "maxActionsPerHour": 20, "maxUnavailableDecode": "25%"},
    }


STUCK_EVIDENCE = "2 rooms in the inflight queue longer than 60s (oldest 92.4s); inflight gauge 3"
GONE_EVIDENCE = (
    "1 rooms wait on decode incarnation(s) that no longer exist (oldest 3.2s); inflight gauge 3"
)
STALL_EVIDENCE = (
    "prealloc queue 0, transfer queue 2, running 1 for 60s with generated tokens flat at 51200"
)


def wedged() -> dict[str, Any]:
    """Mid-incident: two prefill findings, a stalled decode that is cordoned, a long ledger."""
    conditions = [
        Condition(type="Ready", status="False", reason="DecodeDegraded",
                  message="decode 3/4 ready", last_transition_time=at(70), observed_generation=3),
        Condition(type="Wedged", status="True", reason="WedgesFound",
                  message=(f"InflightStuck on demo-prefill-0: {STUCK_EVIDENCE}; "
                           f"PeerIncarnationGone on demo-prefill-1: {GONE_EVIDENCE}; "
                           f"DecodeStalled on demo-decode-2: {STALL_EVIDENCE}"),
                  last_transition_time=at(95), observed_generation=3),
        Condition(type="RemediationSuspended", status="False", reason="WithinBudget",
                  message="6 of 20 actions used this hour", last_transition_time=at(3600),
                  observed_generation=3),
    ]  # fmt: skip
    wedges = [
        WedgeFinding(pod="demo-prefill-0", role="prefill", reason="InflightStuck", rooms=2,
                     oldest_seconds=92.4, peer="demo-decode-2", since=at(35)),
        WedgeFinding(pod="demo-prefill-1", role="prefill", reason="PeerIncarnationGone",
                     rooms=1, oldest_seconds=3.2, peer="demo-decode-3", since=at(5)),
        WedgeFinding(pod="demo-decode-2", role="decode", reason="DecodeStalled", rooms=3,
                     since=at(95)),
    ]  # fmt: skip
    history = [
        LedgerEntry(time=at(3000 - 100 * i), action="FailRooms", pod="demo-prefill-0",
                    peer="demo-decode-1", rooms=1, reason="InflightStuck: old wedge")
        for i in range(4)
    ] + [
        LedgerEntry(time=at(95), action="CordonDecode", pod="demo-decode-2",
                    reason="decode stalled"),
        LedgerEntry(time=at(35), action="FailRooms", pod="demo-prefill-0", peer="demo-decode-2",
                    rooms=2, reason=f"InflightStuck: {STUCK_EVIDENCE}; worker failed 2 of 2 rooms"),
        LedgerEntry(time=at(5), action="FailRooms", pod="demo-prefill-1", peer="demo-decode-3",
                    rooms=1, reason="PeerIncarnationGone: HTTP 401", outcome="Failed"),
    ] + [
        LedgerEntry(time=at(4), action="RestartDecode", pod=f"demo-decode-{i}",
                    reason="cordoned 91s ago and still stalled", dry_run=True)
        for i in range(4)
    ]  # fmt: skip
    status = PDDeploymentStatus(
        observed_generation=3, phase="Wedged", conditions=conditions,
        prefill=RoleStatus(replicas=2, ready_replicas=2, updated_replicas=2, summary="2/2"),
        decode=DecodeStatus(replicas=4, ready_replicas=3, updated_replicas=4, summary="3/4",
                            cordoned_replicas=1),
        router=RoleStatus(replicas=1, ready_replicas=1, updated_replicas=1, summary="1/1"),
        wedged_rooms=3, wedges=wedges,
        remediation=RemediationStatus(
            history=history, cordoned=[CordonRecord(pod="demo-decode-2", since=at(95))],
            actions_last_hour=6, suspended=False, decode_budget=1,
            canaries=CanaryTally(sent=42, requests=80, seconds=31.25, since=at(3600), last=at(5)),
        ),
    )  # fmt: skip
    wire = status_to_wire(status)
    return {"apiVersion": "pdwarden.dev/v1alpha1", "kind": "PDDeployment",
            "metadata": _meta("demo", 3), "spec": _spec(), "status": wire}  # fmt: skip


def suspended() -> dict[str, Any]:
    obj = wedged()
    rem = obj["status"]["remediation"]
    rem.update(suspended=True, actionsLastHour=20, breakerResetAt=at(7200).isoformat())
    return obj


def new() -> dict[str, Any]:
    """Just applied: the operator has not written any status yet."""
    return {"apiVersion": "pdwarden.dev/v1alpha1", "kind": "PDDeployment",
            "metadata": _meta("fresh", 1), "spec": _spec("DryRun")}  # fmt: skip
