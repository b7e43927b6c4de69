"""Questions the ladder asks of the ledger: the last action on a pod, cordons, repeats.

Why apart: every rung reads history the same way (the same mode, DryRun or not; failed entries
never count as done), so the reading is written once and unit-tested with the rungs.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from pdwarden.api import LedgerEntry
from pdwarden.remediation.decide.actions import PodState


def last_action_on(history: Sequence[LedgerEntry], pod: str, dry_run: bool) -> LedgerEntry | None:
    for entry in reversed(history):
        if entry.pod == pod and entry.dry_run == dry_run and entry.outcome != "Failed":
            return entry
    return None


def _virtual_cordon(history: Sequence[LedgerEntry], pod: str) -> datetime | None:
    """In DryRun nothing is cordoned: the time of the recorded decision stands in for it, through
    the DryRun restart decided during it, until a DryRun uncordon (the pod was healthy for a full
    window). So a stalled pod's cordon and restart are each reported once per wedge, not again
    every restartAfterSeconds."""
    for e in reversed(history):
        if e.pod != pod or not e.dry_run or e.outcome == "Failed":
            continue
        if e.action == "CordonDecode":
            return e.time
        if e.action == "UncordonDecode":
            return None
    return None


def cordoned_at(d: PodState, history: Sequence[LedgerEntry], dry_run: bool) -> datetime | None:
    """Since when the plan counts `d` cordoned: the pod's own state, or in DryRun the recorded
    decision standing in for it (`_virtual_cordon`)."""
    return _virtual_cordon(history, d.name) if dry_run else d.cordoned_since


def failed_rooms_for(
    history: Sequence[LedgerEntry], peer: str, since: datetime, dry_run: bool
) -> bool:
    return any(
        e.action == "FailRooms"
        and e.peer == peer
        and e.time >= since
        and e.dry_run == dry_run
        and e.outcome != "Pending"  # not known to have happened: no evidence against the peer
        for e in history
    )


def decided_fail_rooms(
    history: Sequence[LedgerEntry], pod: str, peer: str | None, since: datetime
) -> bool:
    return any(
        e.action == "FailRooms" and e.dry_run and (e.pod, e.peer) == (pod, peer) and e.time >= since
        for e in history
    )


def restarted_since(
    history: Sequence[LedgerEntry], pod: str, since: datetime, dry_run: bool
) -> bool:
    """A restart that went through (one held back by a PodDisruptionBudget, Skipped, did not)."""
    return any(
        e.pod == pod
        and e.action == "RestartDecode"
        and e.outcome == "Succeeded"
        and e.dry_run == dry_run
        and e.time >= since
        for e in history
    )


def held_back_restart(
    history: Sequence[LedgerEntry], pod: str, dry_run: bool
) -> LedgerEntry | None:
    """The pod's last action, if it is a restart that was held back (Skipped)."""
    last = last_action_on(history, pod, dry_run)
    return last if last and last.action == "RestartDecode" and last.outcome == "Skipped" else None
