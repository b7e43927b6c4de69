"""Pods on a node that stopped reporting: unknown to pdwarden, left to Kubernetes.

Why: when a node is lost (its kubelet dead or cut off) its pods' processes may well run on and
answer scrapes, but nothing pdwarden does to them can land: a cordon is a pod condition no
kubelet turns into Ready, a restart is a delete no kubelet confirms (the pod stays Terminating),
and Kubernetes' own node lifecycle controller is already evicting them. Acting there piles
pdwarden's actions on top of Kubernetes' own, so such a pod is judged unknown instead: never
wedged, never acted on, never the reason to fail a prefill's rooms, and the Wedged condition
says why.

It is read from the pod alone (pdwarden needs no access to Nodes): the node lifecycle
controller marks every pod of a NotReady node `Ready=False` and touches nothing else, while a
kubelet never reports `Ready=False` with its containers ready unless a readiness gate holds the
pod (reason `ReadinessGatesNotReady`). So `Ready=False`, `ContainersReady=True` and a reason
that is not the gate's is the controller's mark; so is a gate's reason that outlived every
gate turning True by `GATE_SETTLE_SECONDS` (the node was lost while a gate held the pod, and no
kubelet is left to recompute Ready). A pod the controller marked while pdwarden held it cordoned
is not recognised until then: its cordon already keeps traffic away, and a restart of it waits
restartAfterSeconds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Final

from pdwarden.conditions import kube_time

Obj = Mapping[str, Any]
GATES_REASON: Final = "ReadinessGatesNotReady"  # the kubelet's reason while a gate holds a pod
# A kubelet recomputes Ready within a status sync of a gate turning True; 30 s is many.
GATE_SETTLE_SECONDS: Final = 30.0


def _conditions(pod: Obj) -> dict[str, Obj]:
    conds = (pod.get("status") or {}).get("conditions") or []
    return {str(c.get("type")): c for c in conds if isinstance(c, Mapping)}


def node_lost(pod: Obj, now: datetime) -> str | None:
    """Why `pod` counts as on a lost node, or None when its kubelet still speaks for it."""
    conds = _conditions(pod)
    ready, containers = conds.get("Ready") or {}, conds.get("ContainersReady") or {}
    if ready.get("status") != "False" or containers.get("status") != "True":
        return None
    gates = [
        str(g.get("conditionType"))
        for g in (pod.get("spec") or {}).get("readinessGates") or []
        if isinstance(g, Mapping)
    ]
    if any((conds.get(g) or {}).get("status") != "True" for g in gates):
        return None  # a gate holds it (pdwarden's cordon, or another controller's)
    if ready.get("reason") == GATES_REASON:
        opened = [kube_time((conds.get(g) or {}).get("lastTransitionTime")) for g in gates]
        if not opened or any(t is None for t in opened):
            return None
        latest = max(t for t in opened if t is not None)
        if (now - latest).total_seconds() < GATE_SETTLE_SECONDS:
            return None  # the kubelet has not recomputed Ready since the gate opened: yet
    node = (pod.get("spec") or {}).get("nodeName") or "its node"
    since = ready.get("lastTransitionTime") or "unknown"
    return (
        f"{node} stopped reporting (Ready False since {since} with its containers ready): "
        "left to Kubernetes' eviction"
    )


def lost_pods(pods: Sequence[Obj], now: datetime) -> dict[str, str]:
    """Pod name -> why, for every pod on a node that stopped reporting."""
    out = {}
    for pod in pods:
        why = node_lost(pod, now)
        name = (pod.get("metadata") or {}).get("name")
        if why and isinstance(name, str):
            out[name] = why
    return out
