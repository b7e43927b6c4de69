"""What a reconcile pass decides, as pure functions: what to apply, which pods to mark serving,
and the status of a spec that cannot be reconciled.

Why: `reconcile` is the imperative shell (list, apply, patch); the choices it makes (re-apply
after a spec change or a failed apply, re-apply a drifted workload, leave a cordoned pod alone)
are tested here on plain dicts, without a client.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Final

from pdwarden.api import ConditionType, PDDeploymentStatus
from pdwarden.conditions import set_condition
from pdwarden.constants import ANNOTATION_TEMPLATE_HASH, CONDITION_SERVING, LABEL_ROLE, ROLE_DECODE
from pdwarden.reconciling.observe import Observed

Obj = Mapping[str, Any]
WORKLOAD_KINDS: Final = frozenset({"StatefulSet", "Deployment"})
# Degraded reasons after which every pass re-applies everything (an admin may have fixed it).
RETRY_APPLY_REASONS: Final = ("ApplyFailed", "ConflictingObject")


def degraded(status: PDDeploymentStatus) -> tuple[str, str]:
    """(reason, message) of the Degraded condition, empty when there is none."""
    c = next((c for c in status.conditions if c.type == "Degraded"), None)
    return (c.reason, c.message) if c is not None else ("", "")


def apply_everything(previous: PDDeploymentStatus, generation: int | None) -> bool:
    """Re-apply every object after a spec change, and on every pass while the last apply failed
    (a 403 fixed by an admin, a conflicting object deleted): level-based, bounded by the resync."""
    return previous.observed_generation != generation or degraded(previous)[0] in (
        RETRY_APPLY_REASONS
    )


def drifted(desired: Obj, observed: Observed) -> bool:
    """A workload is missing, or its template hash or replica count differs from the desired."""
    role = desired["metadata"]["labels"].get(LABEL_ROLE, "")
    current = observed.workloads.get(role)
    if current is None:
        return True
    want_hash = desired["metadata"]["annotations"][ANNOTATION_TEMPLATE_HASH]
    have_hash = (current["metadata"].get("annotations") or {}).get(ANNOTATION_TEMPLATE_HASH)
    return bool(
        have_hash != want_hash or current["spec"].get("replicas") != desired["spec"]["replicas"]
    )


def to_apply(
    desired: Sequence[dict[str, Any]], observed: Observed, *, everything: bool
) -> list[dict[str, Any]]:
    """The desired objects this pass writes."""
    return [
        obj
        for obj in desired
        if everything or (obj["kind"] in WORKLOAD_KINDS and drifted(obj, observed))
    ]


def apply_waves(objs: Sequence[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """`objs` in the waves a pass applies them, each wave's objects at once: first what the
    workloads' pods use or sit behind (ServiceAccount, RBAC, Services, PDB, NetworkPolicy), then
    the workloads, so no pod is created before its ServiceAccount exists. Order is kept within a
    wave; an empty wave is left out."""
    first = [o for o in objs if o["kind"] not in WORKLOAD_KINDS]
    second = [o for o in objs if o["kind"] in WORKLOAD_KINDS]
    return [w for w in (first, second) if w]


def pods_to_serve(pods: Sequence[Obj]) -> list[tuple[str, str]]:
    """(namespace, name) of decode pods with no serving condition yet: they start serving.

    A pod that has the condition (True, or False because remediation cordoned it) is left alone.
    """
    out = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        if (meta.get("labels") or {}).get(LABEL_ROLE) != ROLE_DECODE or meta.get(
            "deletionTimestamp"
        ):
            continue
        conditions = (pod.get("status") or {}).get("conditions") or []
        if not any(c.get("type") == CONDITION_SERVING for c in conditions):
            out.append((str(meta.get("namespace")), str(meta.get("name"))))
    return out


def serving_condition(now: datetime) -> dict[str, str]:
    return {
        "type": CONDITION_SERVING,
        "status": "True",
        "reason": "Serving",
        "message": "pdwarden: not cordoned",
        "lastTransitionTime": now.isoformat().replace("+00:00", "Z"),
    }


def invalid_status(
    previous: PDDeploymentStatus, message: str, now: datetime, generation: int | None
) -> PDDeploymentStatus:
    """A spec that slipped past the schema: Degraded and not Ready, phase Failed."""
    conditions = list(previous.conditions)
    types: tuple[ConditionType, ...] = ("Degraded", "Ready")
    for type_ in types:
        conditions = set_condition(
            conditions, type_, status=type_ == "Degraded", reason="InvalidSpec",
            message=message, now=now, generation=generation,
        )  # fmt: skip
    return previous.model_copy(
        update={"observed_generation": generation, "phase": "Failed", "conditions": conditions}
    )
