"""CordonDecode and UncordonDecode on a PDDeployment's own pods: the readiness-gate condition.

Why this way: decode pods pdwarden renders list `pdwarden.dev/serving` in their readinessGates,
so setting that condition False takes a pod out of every Service's ready endpoints (and every
router that honours readiness) without touching its process; True puts it back. The condition's
reason and message say pdwarden set it and when, which is also how a standby replica tells,
after a failover, whether a cordon it finds recorded as pending really happened (`applied`).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, Final

from pdwarden.constants import CONDITION_SERVING
from pdwarden.ports import KubeApi
from pdwarden.remediation.act.done import Done
from pdwarden.remediation.decide import PlannedAction

CORDONED: Final = "Cordoned"
UNCORDONED: Final = "Uncordoned"
MESSAGE_PREFIX: Final = "pdwarden: "


def iso(t: datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


def serving_condition(action: PlannedAction, now: datetime) -> dict[str, Any]:
    cordon = action.kind == "CordonDecode"
    return {
        "type": CONDITION_SERVING,
        "status": "False" if cordon else "True",
        "reason": CORDONED if cordon else UNCORDONED,
        "message": f"{MESSAGE_PREFIX}{action.reason}",
        "lastTransitionTime": iso(now),
    }


async def set_serving(
    client: KubeApi, namespace: str, action: PlannedAction, now: datetime
) -> Done:
    await client.set_pod_condition(namespace, action.pod, serving_condition(action, now))
    return Done()


def serving(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if isinstance(c, Mapping) and c.get("type") == CONDITION_SERVING:
            return c
    return None


def applied(pod: Mapping[str, Any], kind: str, decided: datetime) -> bool:
    """Whether `pod` shows a cordon (or uncordon) pdwarden set at `decided` or later."""
    c = serving(pod)
    if c is None or c.get("reason") != (CORDONED if kind == "CordonDecode" else UNCORDONED):
        return False
    raw = str(c.get("lastTransitionTime") or "")
    try:
        since = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        return False
    return since.tzinfo is not None and since >= decided
