"""The fleet's objects: N PDDeployments and, for the same pods, N LeaderWorkerSets; applying,
rolling and reading them back with kubectl.

Why one place: the side-by-side comparison is only fair if both controllers get the same pods on
the same fake nodes (25 per deployment: pdwarden's 8 prefill + 16 decode + 1 router, LWS's 5
groups of 5), rolled by the same kind of template change, and judged Ready the same way: by the
time the controller itself wrote that it was ready (the condition's lastTransitionTime) minus
the object's creationTimestamp, both server-side, so the bench's own polling adds nothing.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Final

from e2e.apicount import Kubectl
from e2e.kubelet.kwok import SCALE_POD_PLACEMENT

from pdwarden.constants import API_VERSION, KIND

PODS_PER_DEPLOYMENT: Final = 25
PREFILL, DECODE = 8, 16
LWS_GROUPS, LWS_SIZE = 5, 5
INTERVAL: Final = 5
WEDGE_AFTER: Final = 15
NAMESPACES: Final = 4  # the fleet is spread over this many namespaces


def pd_namespace(i: int, prefix: str) -> str:
    return f"{prefix}-{i % NAMESPACES}"


def pddeployment(i: int, namespace: str, mode: str = "Enforce", rev: int = 0) -> dict[str, Any]:
    place = {**SCALE_POD_PLACEMENT}
    env = [{"name": "FLEET_REV", "value": str(rev)}]
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": f"pd-{i:03d}", "namespace": namespace},
        "spec": {
            "engine": "pdworker",
            "image": "pdwarden/pdworker:fleet",
            "model": {"name": "tiny"},
            "prefill": {"replicas": PREFILL, "gpus": 1, "env": env, **place},
            "decode": {"replicas": DECODE, "gpus": 1, "env": env, **place},
            "router": {"replicas": 1, **place},
            "remediation": {"mode": mode, "scrapeIntervalSeconds": INTERVAL,
                            "wedgeAfterSeconds": WEDGE_AFTER},
        },
    }  # fmt: skip


def lws(i: int, namespace: str, rev: int = 0) -> dict[str, Any]:
    container = {
        "name": "worker", "image": "pdwarden/pdworker:fleet",
        "env": [{"name": "FLEET_REV", "value": str(rev)}],
        "resources": {"limits": {"nvidia.com/gpu": "1"}},
    }  # fmt: skip
    template = {"spec": {**SCALE_POD_PLACEMENT, "containers": [container]}}
    return {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": f"lws-{i:03d}", "namespace": namespace},
        "spec": {
            "replicas": LWS_GROUPS,
            "leaderWorkerTemplate": {"size": LWS_SIZE, "workerTemplate": template},
        },
    }


def apply(kubectl: Kubectl, objs: Sequence[dict[str, Any]]) -> None:
    for start in range(0, len(objs), 50):
        doc = {"apiVersion": "v1", "kind": "List", "items": list(objs[start : start + 50])}
        kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=json.dumps(doc))


def items(kubectl: Kubectl, resource: str, namespaces: Sequence[str]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for ns in namespaces:
        data = json.loads(kubectl("get", resource, "-n", ns, "-o", "json"))
        out.extend(data.get("items") or [])
    return out


def _t(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any] | None:
    conditions = (obj.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == type_), None)


def pd_ready(obj: dict[str, Any]) -> bool:
    c = condition(obj, "Ready")
    st = obj.get("status") or {}
    return bool(
        c and c.get("status") == "True"
        and st.get("observedGeneration") == obj["metadata"].get("generation")
    )  # fmt: skip


def lws_ready(obj: dict[str, Any]) -> bool:
    spec, st = obj.get("spec") or {}, obj.get("status") or {}
    want = spec.get("replicas", 0)
    c = condition(obj, "Available")
    return bool(
        c and c.get("status") == "True" and st.get("readyReplicas") == want
        and st.get("updatedReplicas") == want
    )  # fmt: skip


def ready_seconds(obj: dict[str, Any], type_: str, since: float | None = None) -> float | None:
    """Seconds from creation (or `since`, wall time) to the controller's last transition of
    `type_` to True; None if it is not True."""
    c = condition(obj, type_)
    if not c or c.get("status") != "True" or not c.get("lastTransitionTime"):
        return None
    start = since if since is not None else _t(obj["metadata"]["creationTimestamp"])
    return max(0.0, _t(c["lastTransitionTime"]) - start)
