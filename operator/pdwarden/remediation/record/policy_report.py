"""Selection and cordon readiness -> the parts of a PDRemediationPolicy's status they decide.

Why: the loop that drives policies (policy_cycle) writes status only on material change, and
its Conflict and CordonUnavailable conditions must keep their lastTransitionTime while nothing
flips, exactly like conditions.set_condition does for a PDDeployment. This pure function fills in
what selection knows (pod counts per role, refused pods, those two conditions) over the previous
status; `policy_cycle_status` adds what the remediation pass decided, through the very function
that builds a PDDeployment's status (ledger.cycle_status), so the two kinds report alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from pdwarden.api import (
    CONDITION_TYPES,
    Condition,
    HeldBack,
    LedgerEntry,
    PDDeploymentStatus,
    PDRemediationPolicySpec,
    PDRemediationPolicyStatus,
    PolicyCondition,
    PolicyConditionType,
)
from pdwarden.api.policy_status import MAX_HELD_BACK, PolicyDecodeStatus, PolicyRoleStatus
from pdwarden.remediation.decide import Plan, PodState
from pdwarden.remediation.detect.advisories import PodAdvice
from pdwarden.remediation.detect.rules import Detection
from pdwarden.remediation.policy.cordon import CordonCheck
from pdwarden.remediation.policy.scope import Scope, conflict_message, is_cordoned
from pdwarden.remediation.record.ledger import cycle_status
from pdwarden.values import ScreenReport


def _set(
    conditions: list[PolicyCondition],
    type_: PolicyConditionType,
    status: bool | None,
    *,
    reason: str,
    message: str,
    now: datetime,
    generation: int | None,
) -> list[PolicyCondition]:
    value = "Unknown" if status is None else ("True" if status else "False")
    previous = next((c for c in conditions if c.type == type_), None)
    since = previous.last_transition_time if previous and previous.status == value else now
    new = PolicyCondition(type=type_, status=value, reason=reason, message=message[:32768],
                          last_transition_time=since, observed_generation=generation)  # fmt: skip
    return [c for c in conditions if c.type != type_] + [new]


def selection_status(
    spec: PDRemediationPolicySpec,
    scope: Scope,
    cordon: CordonCheck,
    previous: PDRemediationPolicyStatus,
    *,
    now: datetime,
    generation: int | None,
) -> PDRemediationPolicyStatus:
    """`previous` with pods, refusals, Conflict and CordonUnavailable brought up to date."""
    prefill = PolicyRoleStatus(
        matched=len(scope.prefill_matched),
        eligible=len(scope.prefill),
        ready=sum(p.ready for p in scope.prefill_matched),
        selector=spec.prefill_selector.to_query(),
    )
    decode = PolicyDecodeStatus(
        matched=len(scope.decode_matched),
        eligible=len(scope.decode),
        ready=sum(p.ready for p in scope.decode_matched),
        selector=spec.decode_selector.to_query(),
        cordoned=sum(is_cordoned(p, spec.cordon) for p in scope.decode_matched),
    )
    conditions = list(previous.conditions)
    conflict = conflict_message(scope)
    conditions = _set(
        conditions, "Conflict", bool(conflict),
        reason="PodsSelectedTwice" if conflict else "NoOverlap",
        message=conflict or "no other policy selects these pods", now=now, generation=generation,
    )  # fmt: skip
    conditions = _set(
        conditions, "CordonUnavailable", cordon.unavailable, reason=cordon.reason,
        message=cordon.message, now=now, generation=generation,
    )  # fmt: skip
    return previous.model_copy(
        update={
            "observed_generation": generation,
            "prefill": prefill,
            "decode": decode,
            "refused": list(scope.refused),
            "conditions": conditions,
        }
    )


def inactive_status(
    previous: PDRemediationPolicyStatus,
    *,
    invalid: str | None,
    now: datetime,
    generation: int | None,
) -> PDRemediationPolicyStatus:
    """The status of a policy that runs no cycles, saying why: mode Off (RemediationSuspended,
    reason ModeOff) or a spec that slipped past the schema (`invalid`, the parser's message:
    Degraded, reason InvalidSpec, as for a PDDeployment). Either way Ready is False, Wedged and
    Advisories Unknown (nothing is scraped or read), and wedges and holds from earlier cycles are
    dropped: they are no longer watched."""
    if invalid is None:
        reason = "ModeOff"
        message = "spec.remediation.mode is Off: the selected pods are neither scraped nor acted on"
        suspended: PolicyConditionType = "RemediationSuspended"
    else:
        reason, message, suspended = "InvalidSpec", invalid, "Degraded"
    conditions = list(previous.conditions)
    values: tuple[tuple[PolicyConditionType, bool | None], ...] = (
        (suspended, True), ("Ready", False), ("Wedged", None), ("Advisories", None),
    )  # fmt: skip
    for type_, value in values:
        conditions = _set(conditions, type_, value, reason=reason, message=message, now=now,
                          generation=generation)  # fmt: skip
    return previous.model_copy(
        update={
            "observed_generation": generation,
            "conditions": conditions,
            "wedges": [],
            "wedged_rooms": 0,
            "held_back": [],
        }
    )


# -- after remediation: the PDDeployment's status logic, on the policy's status ----------------


def as_deployment_status(status: PDRemediationPolicyStatus) -> PDDeploymentStatus:
    """The part of a policy's status that a PDDeployment's status also has (conditions of the
    six shared types, wedges, the ledger), so `ledger.cycle_status` and
    `ledger.breaker_reset_at` run on it unchanged: one implementation for both kinds."""
    return PDDeploymentStatus(
        conditions=[
            Condition.model_validate(c.model_dump()) for c in status.conditions
            if c.type in CONDITION_TYPES
        ],
        wedged_rooms=status.wedged_rooms,
        wedges=list(status.wedges),
        remediation=status.remediation,
    )  # fmt: skip


def merge_held_back(
    previous: Sequence[HeldBack],
    new: Sequence[HeldBack],
    done: Sequence[LedgerEntry],
    matched: frozenset[str],
) -> list[HeldBack]:
    """What is held back now: this cycle's refusals, and earlier ones still pending (the pod is
    still matched and the action has not gone through since), newest first, bounded."""
    resolved = {(e.action, e.pod) for e in done if e.outcome == "Succeeded"}
    fresh = {(h.action, h.pod) for h in new}
    kept = [
        h for h in previous
        if h.pod in matched and (h.action, h.pod) not in resolved | fresh
    ]  # fmt: skip
    return sorted([*new, *kept], key=lambda h: h.time, reverse=True)[:MAX_HELD_BACK]


def policy_cycle_status(
    *,
    previous: PDRemediationPolicyStatus,
    spec: PDRemediationPolicySpec,
    scope: Scope,
    cordon: CordonCheck,
    detection: Detection,
    decision: Plan,
    history: Sequence[LedgerEntry],
    decodes: Sequence[PodState],
    held_back: Sequence[HeldBack],
    done: Sequence[LedgerEntry],
    now: datetime,
    reset_at: datetime | None,
    generation: int | None,
    advisories: Sequence[PodAdvice] = (),
    screen: ScreenReport | None = None,
) -> PDRemediationPolicyStatus:
    """The policy's status after one cycle: the PDDeployment's wedges, ledger, Wedged,
    RemediationSuspended and Advisories (ledger.cycle_status), selection (pods, refusals,
    Conflict, CordonUnavailable), Ready, and what a PDB held back."""
    shared = cycle_status(
        previous=as_deployment_status(previous), policy=spec.remediation, generation=generation,
        detection=detection, decision=decision, history=history, decodes=decodes, now=now,
        reset_at=reset_at, advisories=advisories, screen=screen,
    )  # fmt: skip
    updated: dict[str, PolicyCondition] = {
        c.type: PolicyCondition.model_validate(c.model_dump()) for c in shared.conditions
    }
    conditions = [updated.pop(c.type, c) for c in previous.conditions] + list(updated.values())
    matched = len(scope.prefill_matched) + len(scope.decode_matched)
    watched = len(scope.prefill) + len(scope.decode)
    conditions = _set(
        conditions, "Ready", bool(scope.prefill_matched and scope.decode_matched),
        reason="PodsSelected" if scope.prefill_matched and scope.decode_matched
        else "NoPodsSelected",
        message=(
            f"{len(scope.prefill_matched)} prefill and {len(scope.decode_matched)} decode pod(s) "
            f"matched, {watched} of {matched} eligible ({spec.remediation.mode})"
        ),
        now=now, generation=generation,
    )  # fmt: skip
    if any(c.type == "Degraded" for c in conditions):  # left by an invalid spec, now fixed
        conditions = _set(conditions, "Degraded", False, reason="SpecValid",
                          message="the spec is valid", now=now, generation=generation)  # fmt: skip
    out = previous.model_copy(
        update={
            "conditions": conditions,
            "wedges": shared.wedges,
            "wedged_rooms": shared.wedged_rooms,
            "remediation": shared.remediation,
            "held_back": merge_held_back(
                previous.held_back, held_back, done,
                frozenset(p.name for p in (*scope.prefill_matched, *scope.decode_matched)),
            ),
        }
    )  # fmt: skip
    return selection_status(spec, scope, cordon, out, now=now, generation=generation)
