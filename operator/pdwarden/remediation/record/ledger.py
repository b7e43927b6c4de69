"""What a remediation cycle records: ledger entries, the breaker's reset, the status it writes.

Why pure: the ledger is the operator's durable memory (cooldowns and the circuit breaker read
it after a restart or a failover), and the conditions are what users read first. Building them
is a function of plain data here, unit-tested without a client; `cycle` only performs the
actions and hands the outcomes in. The merge functions at the end keep two writers (two replicas
after a failover, or reconcile and remediation) from erasing each other's entries.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Final, TypeVar

from pydantic import BaseModel

from pdwarden.api import (
    CanaryTally,
    CordonRecord,
    LedgerEntry,
    PDDeploymentStatus,
    RemediationSpec,
    RemediationStatus,
    WedgeFinding,
    parse_status,
    status_to_wire,
    to_wire,
)
from pdwarden.api.status import (
    MAX_CORDONED,
    MAX_HISTORY,
    MAX_MESSAGE,
    MAX_PENDING_ROOMS,
    MAX_WEDGED_MESSAGE,
    MAX_WEDGES,
    LedgerOutcome,
)
from pdwarden.conditions import phase_of, set_condition
from pdwarden.constants import ANNOTATION_RESET_BREAKER
from pdwarden.remediation.decide import Plan, PlannedAction, PodState, breaker
from pdwarden.remediation.detect import advisories as advice
from pdwarden.remediation.detect.advisories import PodAdvice
from pdwarden.remediation.detect.evidence import Finding
from pdwarden.remediation.detect.rules import Detection
from pdwarden.remediation.record.screened import SCREENED, screen_condition
from pdwarden.remediation.scrape import sanitize
from pdwarden.values import CanaryCost, ScreenReport

S = TypeVar("S")  # a kind's status: PDDeploymentStatus, PDRemediationPolicyStatus
SUSPENDED: Final = "RemediationSuspended"
ADVISORIES: Final = "Advisories"


def breaker_reset_at(
    annotations: Mapping[str, Any],
    generation: int | None,
    previous: PDDeploymentStatus,
    now: datetime,
) -> datetime | None:
    """The breaker resets on the reset annotation, or when the spec changed since it tripped."""
    if ANNOTATION_RESET_BREAKER in annotations:
        return now
    tripped = next((c for c in previous.conditions if c.type == SUSPENDED), None)
    if (
        tripped is not None
        and tripped.status == "True"
        and tripped.observed_generation is not None
        and tripped.observed_generation != generation
    ):
        return now
    return (previous.remediation or RemediationStatus()).breaker_reset_at


def new_entry_id() -> str:
    """A short random id; the Pending and completed forms of one entry share it."""
    return secrets.token_hex(6)


def ledger_entry(
    action: PlannedAction,
    *,
    now: datetime,
    dry_run: bool,
    outcome: LedgerOutcome,
    detail: str = "",
    rooms: int | None = None,
    entry_id: str | None = None,
) -> LedgerEntry:
    """One ledger entry; every string is bounded and cleaned, so building it cannot fail. A
    Pending FailRooms carries its room ids (so a standby can complete it); no other entry does."""
    reason = action.reason + (f"; {detail}" if detail else "")
    count = action.room_count if rooms is None else rooms
    room_ids = (
        list(action.rooms[:MAX_PENDING_ROOMS])
        if outcome == "Pending" and action.kind == "FailRooms"
        else None
    )
    return LedgerEntry(
        id=entry_id, time=now, action=action.kind,
        pod=sanitize.text(action.pod, sanitize.MAX_POD_NAME),
        peer=sanitize.pod_name(action.peer), rooms=max(count, 0),
        reason=sanitize.text(reason, MAX_MESSAGE), dry_run=dry_run, outcome=outcome,
        uid=sanitize.text(action.uid, 64) or None, room_ids=room_ids,
    )  # fmt: skip


def wedge_record(f: Finding, now: datetime) -> WedgeFinding:
    return WedgeFinding(
        pod=sanitize.text(f.pod, sanitize.MAX_POD_NAME), role=f.role,
        reason=f.reason, rooms=max(f.room_count, 0),
        oldest_seconds=round(sanitize.seconds(f.oldest_seconds), 1),
        peer=sanitize.pod_name(f.peer), since=now,
    )  # fmt: skip


def _wedged(detection: Detection) -> tuple[bool | None, str, str]:
    unknown = (
        f"cannot judge (no action is taken on these pods): {'; '.join(detection.unknown)}"
        if detection.unknown
        else ""
    )
    if detection.findings:
        message = "; ".join(f"{f.reason} on {f.pod}: {f.evidence}" for f in detection.findings)
        return True, "WedgesFound", message + (f". And {unknown}" if unknown else "")
    if unknown:
        return None, "MetricsUnavailable", unknown
    return False, "NoWedges", "every worker's queues are moving"


def _suspended_message(used: int, limit: int, is_open: bool, held_back: Sequence[str]) -> str:
    if is_open:
        text = (
            f"{used} actions in the last hour reached maxActionsPerHour {limit}; reset with the "
            f"annotation {ANNOTATION_RESET_BREAKER} or by changing the spec"
        )
    else:
        text = f"{used} of {limit} actions used this hour"
    held = "; ".join(held_back)
    return text + (f". Held back: {held}" if held else "")


# The canary tally alone rewrites the status at most this often: an idle pool gets a canary every
# quiet window, and a status write for each would be API traffic for nothing (see `held_tally`).
TALLY_EVERY_SECONDS: Final = 300


def held_tally(new: S, previous: S, now: datetime) -> tuple[S, bool]:
    """(the status to write, whether its canary tally is written): `new` unless the tally is all
    that changed and the previous one is younger than TALLY_EVERY_SECONDS; then `new` with the
    previous tally, and the caller keeps this cycle's canary cost for a later write. Any other
    change writes the tally with it."""
    rem, before_rem = getattr(new, "remediation", None), getattr(previous, "remediation", None)
    before = before_rem.canaries if isinstance(before_rem, RemediationStatus) else None
    if (
        not isinstance(new, BaseModel)
        or not isinstance(previous, BaseModel)
        or not isinstance(rem, RemediationStatus)
        or rem.canaries == before
    ):
        return new, True
    if (
        before is None
        or before.last is None
        or (now - before.last).total_seconds() >= (TALLY_EVERY_SECONDS)
    ):
        return new, True
    held = new.model_copy(update={"remediation": rem.model_copy(update={"canaries": before})})
    if to_wire(held) != to_wire(previous):
        return new, True
    return held, False


def tally(before: CanaryTally | None, cost: CanaryCost, now: datetime) -> CanaryTally | None:
    """The canary tally after a cycle whose canaries cost `cost` (none yet: no tally)."""
    if not cost.sent:
        return before
    if before is None:
        before = CanaryTally(since=now)
    return before.model_copy(
        update={
            "sent": before.sent + cost.sent,
            "requests": before.requests + cost.requests,
            "seconds": round(before.seconds + cost.seconds, 3),
            "last": now,
        }
    )


def cycle_status(
    *,
    previous: PDDeploymentStatus,
    policy: RemediationSpec,
    generation: int | None,
    detection: Detection,
    decision: Plan,
    history: Sequence[LedgerEntry],
    decodes: Sequence[PodState],
    now: datetime,
    reset_at: datetime | None,
    advisories: Sequence[PodAdvice] = (),
    screen: ScreenReport | None = None,
) -> PDDeploymentStatus:
    """The status after a cycle: `history` is the ledger including this cycle's entries;
    `advisories` are this cycle's configuration advisories (a condition of their own, which
    nothing else reads); `screen`, in prometheus mode, how the pods were judged (the Screened
    condition; direct mode has none)."""
    history = list(history)[-MAX_HISTORY:]
    cordoned = [
        CordonRecord(pod=d.name, since=d.cordoned_since)
        for d in decodes
        if d.cordoned_since is not None
    ][:MAX_CORDONED]
    state = breaker(
        history, now, dry_run=decision.dry_run, reset_at=reset_at, limit=policy.max_actions_per_hour
    )
    remediation = RemediationStatus(
        history=history, cordoned=cordoned, actions_last_hour=state.used, suspended=state.open,
        decode_budget=max(decision.budget, 0), breaker_reset_at=reset_at,
        canaries=tally((previous.remediation or RemediationStatus()).canaries,
                       detection.canary_cost, now),
    )  # fmt: skip
    wedged, reason, message = _wedged(detection)
    conditions = set_condition(
        list(previous.conditions), "Wedged", status=wedged, reason=reason,
        message=sanitize.text(message, MAX_WEDGED_MESSAGE), now=now, generation=generation,
    )  # fmt: skip
    conditions = set_condition(
        conditions, SUSPENDED, status=state.open,
        reason="CircuitBreakerOpen" if state.open else "WithinBudget",
        message=_suspended_message(state.used, state.limit, state.open, decision.held_back),
        now=now, generation=generation,
    )  # fmt: skip
    found, why, text = advice.condition(advisories)
    conditions = set_condition(
        conditions, ADVISORIES, status=found, reason=why, message=text, now=now,
        generation=generation,
    )  # fmt: skip
    if screen is not None:
        ok, why, text = screen_condition(screen)
        conditions = set_condition(
            conditions, SCREENED, status=ok, reason=why, message=text, now=now,
            generation=generation,
        )  # fmt: skip
    before = next((c for c in previous.conditions if c.type == SUSPENDED), None)
    if state.open and before is not None and before.status == "True":
        # Keep the generation it tripped at, so a spec change is what resets it.
        conditions = [
            c.model_copy(update={"observed_generation": before.observed_generation})
            if c.type == SUSPENDED else c
            for c in conditions
        ]  # fmt: skip
    return previous.model_copy(
        update={
            "conditions": conditions,
            "wedges": [wedge_record(f, now) for f in detection.findings][:MAX_WEDGES],
            "wedged_rooms": detection.wedged_rooms,
            "remediation": remediation,
            "phase": phase_of(conditions, invalid=previous.phase == "Failed"),
        }
    )


def mode_off_status(
    previous: PDDeploymentStatus, *, now: datetime, generation: int | None
) -> PDDeploymentStatus:
    """The status of a PDDeployment whose spec.remediation.mode is Off: RemediationSuspended
    (reason ModeOff), Wedged and Advisories Unknown, since nothing is scraped or read; earlier
    wedges are dropped, they are no longer watched. The ledger is kept: it is history."""
    message = "spec.remediation.mode is Off: the workers are neither scraped nor acted on"
    conditions = list(previous.conditions)
    for type_, value in ((SUSPENDED, True), ("Wedged", None), (ADVISORIES, None)):
        conditions = set_condition(
            conditions, type_, status=value, reason="ModeOff", message=message, now=now,  # type: ignore[arg-type]
            generation=generation,
        )  # fmt: skip
    return previous.model_copy(
        update={
            "conditions": conditions,
            "wedges": [],
            "wedged_rooms": 0,
            "phase": phase_of(conditions, invalid=previous.phase == "Failed"),
        }
    )


# -- two writers, one ledger ---------------------------------------------------------------

EntryKey = tuple[str, ...]


def entry_key(e: LedgerEntry) -> EntryKey:
    """An entry's identity: its id (its Pending and completed forms are one entry); for entries
    written before ids existed, all of it (the same record seen twice is one entry)."""
    if e.id:
        return ("id", e.id)
    return (
        e.time.isoformat(), e.action, e.pod, e.peer or "", str(e.rooms), e.reason,
        str(e.dry_run), e.outcome,
    )  # fmt: skip


def supersedes(new: LedgerEntry, held: LedgerEntry) -> bool:
    """A completed entry replaces its Pending form, never the other way round."""
    return held.outcome == "Pending" and new.outcome != "Pending"


def merge_history(*histories: Iterable[LedgerEntry]) -> list[LedgerEntry]:
    """The union of ledgers, oldest first, bounded: the first copy of an entry wins, except
    that a completed entry replaces its Pending form wherever either came from."""
    seen: dict[EntryKey, LedgerEntry] = {}
    for history in histories:
        for e in history:
            key = entry_key(e)
            held = seen.get(key)
            if held is None or supersedes(e, held):
                seen[key] = e
    merged = sorted(seen.values(), key=lambda e: e.time)  # stable: equal times keep their order
    return merged[-MAX_HISTORY:]


def missing_from(
    history: Sequence[LedgerEntry], entries: Iterable[LedgerEntry]
) -> list[LedgerEntry]:
    """`entries` that `history` does not hold (yet): absent, or held only as Pending."""
    have = {entry_key(e): e for e in history}
    out = []
    for e in entries:
        held = have.get(entry_key(e))
        if held is None or supersedes(e, held):
            out.append(e)
    return out


def pending(history: Sequence[LedgerEntry]) -> list[LedgerEntry]:
    return [e for e in history if e.outcome == "Pending"]


def _three_way(ours: Any, base: Any, theirs: Any) -> Any:
    """Our value if we changed it since `base`, else theirs."""
    return theirs if ours == base else ours


def rebase(
    ours: PDDeploymentStatus, base: PDDeploymentStatus, theirs: PDDeploymentStatus
) -> PDDeploymentStatus:
    """Our status computed from `base`, re-applied on `theirs` (what the object holds now).

    The ledger is the union of both (nothing either writer recorded is lost); every other field,
    and each condition by type, is ours where we changed it since `base` and theirs otherwise.
    """
    o, b, t = status_to_wire(ours), status_to_wire(base), status_to_wire(theirs)
    out: dict[str, Any] = {}
    for key in {*o, *b, *t} - {"conditions", "remediation", "phase"}:
        value = _three_way(o.get(key), b.get(key), t.get(key))
        if value is not None:
            out[key] = value
    by_type = [{c["type"]: c for c in s.get("conditions") or []} for s in (o, b, t)]
    conditions = []
    for type_ in dict.fromkeys([*by_type[2], *by_type[0]]):
        value = _three_way(by_type[0].get(type_), by_type[1].get(type_), by_type[2].get(type_))
        if value is not None:
            conditions.append(value)
    out["conditions"] = conditions
    ro, rb, rt = (s.get("remediation") or {} for s in (o, b, t))
    if ro or rt:
        rem = {k: _three_way(ro.get(k), rb.get(k), rt.get(k)) for k in {*ro, *rb, *rt}}
        rem = {k: v for k, v in rem.items() if v is not None}
        mine = (ours.remediation or RemediationStatus()).history
        older = (base.remediation or RemediationStatus()).history
        theirs_history = (theirs.remediation or RemediationStatus()).history
        history = merge_history(theirs_history, missing_from(older, mine))
        rem["history"] = [status_to_wire_entry(e) for e in history]
        out["remediation"] = rem
    merged = parse_status(out)
    invalid = _three_way(o.get("phase"), b.get("phase"), t.get("phase")) == "Failed"
    return merged.model_copy(update={"phase": phase_of(merged.conditions, invalid=invalid)})


def status_to_wire_entry(e: LedgerEntry) -> dict[str, Any]:
    return e.model_dump(mode="json", by_alias=True, exclude_none=True)
