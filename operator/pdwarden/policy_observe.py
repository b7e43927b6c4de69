"""Selection and cordon readiness -> the parts of a PDRemediationPolicy's status they decide.

Why: the loop that will drive policies (next session) writes status only on material change, and
its Conflict and CordonUnavailable conditions must keep their lastTransitionTime while nothing
flips, exactly like conditions.set_condition does for a PDDeployment. This pure function fills in
what selection knows (pod counts per role, refused pods, those two conditions) over the previous
status, leaving wedges, the ledger and the other conditions to the remediation pass.
"""

from __future__ import annotations

from datetime import datetime

from pdwarden.api import (
    PDRemediationPolicySpec,
    PDRemediationPolicyStatus,
    PolicyCondition,
    PolicyConditionType,
)
from pdwarden.api.policy_status import PolicyDecodeStatus, PolicyRoleStatus
from pdwarden.policy_actions import CordonCheck
from pdwarden.policy_scope import Scope, conflict_message, is_cordoned


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
