"""Condition bookkeeping: keep lastTransitionTime stable unless a condition's status flips.

Why: status must change only on material change (every write is a watch event for every
client); a condition rewritten with a fresh timestamp on every pass would churn forever.
"""

from __future__ import annotations

from datetime import datetime

from pdwarden.api import Condition, ConditionType
from pdwarden.api.status import MAX_CONDITION_MESSAGE


def set_condition(
    conditions: list[Condition],
    type_: ConditionType,
    *,
    status: bool | None,
    reason: str,
    message: str,
    now: datetime,
    generation: int | None,
) -> list[Condition]:
    """Return `conditions` with `type_` set; the transition time moves only on a status flip."""
    value = "Unknown" if status is None else ("True" if status else "False")
    previous = next((c for c in conditions if c.type == type_), None)
    since = previous.last_transition_time if previous and previous.status == value else now
    new = Condition(
        type=type_,
        status=value,
        reason=reason,
        message=message[:MAX_CONDITION_MESSAGE],
        last_transition_time=since,
        observed_generation=generation,
    )
    if previous is None:
        return [*conditions, new]
    # In place: two writers (reconcile, remediation) each set their own conditions, and a
    # condition moved to the end would change the other's list on every pass, a status write
    # each time, forever.
    return [new if c.type == type_ else c for c in conditions]


def condition_is(conditions: list[Condition], type_: ConditionType, value: str = "True") -> bool:
    return any(c.type == type_ and c.status == value for c in conditions)


def phase_of(conditions: list[Condition], invalid: bool = False) -> str:
    """One word for kubectl get, derived from the conditions (worst first)."""
    if invalid:
        return "Failed"
    if condition_is(conditions, "Degraded"):
        return "Degraded"
    if condition_is(conditions, "Wedged"):
        return "Wedged"
    if condition_is(conditions, "Ready"):
        return "Ready"
    return "Progressing"


def kube_time(raw: object) -> datetime | None:
    """A Kubernetes timestamp ("2026-12-06T08:00:00Z") as an aware datetime; None if unreadable."""
    try:
        at = datetime.fromisoformat(str(raw).replace("Z", "+00:00"))
    except ValueError:
        return None
    return at if at.tzinfo is not None else None
