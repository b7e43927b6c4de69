"""Kubernetes Events for what the operator did and why, on the PDDeployment and on pods.

Why: `kubectl describe` and `kubectl get events` are where users look first; every action,
refusal and dry-run decision is posted here, never only logged.
"""

from __future__ import annotations

import logging
import uuid
from datetime import UTC, datetime
from typing import Any, Literal, Protocol

from pdwarden import metrics
from pdwarden.k8s.client import ApiError

Obj = dict[str, Any]
COMPONENT = "pdwarden"
MAX_MESSAGE = 1024
log = logging.getLogger("pdwarden.events")


class EventSink(Protocol):
    async def create_event(self, event: Obj) -> None: ...


def object_ref(obj: Obj) -> Obj:
    meta = obj["metadata"]
    return {
        "apiVersion": obj.get("apiVersion", "v1"),
        "kind": obj.get("kind", "Pod"),
        "name": meta["name"],
        "namespace": meta.get("namespace"),
        "uid": meta.get("uid"),
        "resourceVersion": meta.get("resourceVersion"),
    }


def build_event(
    involved: Obj,
    reason: str,
    message: str,
    type_: Literal["Normal", "Warning"] = "Normal",
    name: str | None = None,
) -> Obj:
    now = datetime.now(UTC).isoformat().replace("+00:00", "Z")
    ref = object_ref(involved)
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": name or f"{ref['name'][:200]}.{uuid.uuid4().hex[:12]}",
            "namespace": ref["namespace"],
        },
        "involvedObject": ref,
        "reason": reason,
        "message": message[:MAX_MESSAGE],
        "type": type_,
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "reportingInstance": COMPONENT,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


async def post_event(
    client: EventSink,
    involved: Obj,
    reason: str,
    message: str,
    type_: Literal["Normal", "Warning"] = "Normal",
    *,
    name: str | None = None,
) -> bool:
    """Post an Event; a failure to post is counted and reported by the return value, never
    raised (an Event is worth less than the action or cycle that posts it). With a `name`, the
    Event is posted at most once: the API server refuses a second one (409), which is success."""
    try:
        await client.create_event(build_event(involved, reason, message, type_, name))
    except ApiError as e:
        if e.status == 409 and name is not None:
            return True  # posted before (by us, or by the replica we took over from)
        metrics.ERRORS.labels("event").inc()
        log.debug("event %s not posted: %s", reason, e)
        return False
    except Exception as e:  # contained by design, counted below
        metrics.ERRORS.labels("event").inc()
        log.debug("event %s not posted: %s: %s", reason, type(e).__name__, e)
        return False
    return True
