"""Which objects belong to a PDDeployment: label selectors and the owner chain, as pure rules.

Why: labels are only a hint; anyone who can create a pod in the namespace can copy them. The
operator sends worker pods a bearer token and acts on them (fail rooms, cordon, restart), so a
pod counts as ours only when its controller is a workload that the PDDeployment owns (by UID),
and, for a StatefulSet, when its name is one of that StatefulSet's ordinals. One module keeps
the selector string and these checks identical for reconcile and remediation.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pdwarden.constants import LABEL_DEPLOYMENT, LABEL_ROLE

Obj = Mapping[str, Any]
_ORDINAL = re.compile(r"^(?P<base>.+)-(?P<ordinal>0|[1-9][0-9]{0,8})$")


def selector(deployment: str, role: str | None = None) -> str:
    """The label selector of a PDDeployment's children (of one role, if given)."""
    sel = f"{LABEL_DEPLOYMENT}={deployment}"
    return sel + (f",{LABEL_ROLE}={role}" if role else "")


def owned_by(obj: Obj, owner_uid: str) -> bool:
    """True if `obj` lists the owner (by UID) among its owner references."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return any(isinstance(r, Mapping) and r.get("uid") == owner_uid for r in refs)


def controller_of(obj: Obj) -> Mapping[str, Any] | None:
    """The owner reference with controller=true, if any."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return next((r for r in refs if isinstance(r, Mapping) and r.get("controller") is True), None)


@dataclass(frozen=True)
class Workloads:
    """The workloads a PDDeployment owns, as the owner chain needs them."""

    stateful_sets: Mapping[str, tuple[str, int]]  # uid -> (name, replicas)
    router_deployments: frozenset[str] = frozenset()  # names of owned Deployments

    @classmethod
    def of(
        cls, stateful_sets: Iterable[Obj], deployments: Iterable[Obj], owner_uid: str
    ) -> Workloads:
        """From listed objects (a LIST's items carry no `kind`, hence two arguments)."""
        sts: dict[str, tuple[str, int]] = {}
        for obj in stateful_sets:
            meta = obj.get("metadata") or {}
            if owned_by(obj, owner_uid) and meta.get("uid") and meta.get("name"):
                replicas = (obj.get("spec") or {}).get("replicas")
                sts[str(meta["uid"])] = (str(meta["name"]), int(replicas or 0))
        deps = {
            str((obj.get("metadata") or {}).get("name"))
            for obj in deployments
            if owned_by(obj, owner_uid) and (obj.get("metadata") or {}).get("name")
        }
        return cls(sts, frozenset(deps))


def owned_chain(pod: Obj, workloads: Workloads) -> bool:
    """True if the pod's controller chain leads to the PDDeployment.

    Prefill and decode pods: controller StatefulSet owned by the PDDeployment (by UID), and the
    pod's name is one of its ordinals below spec.replicas (pod names are unique per namespace,
    so a look-alike cannot take a name the StatefulSet holds). Router pods: controller a
    ReplicaSet named after an owned Deployment (ReplicaSets are not read, so this one is a
    weaker check; router pods never receive a token and are never acted on).
    """
    ref = controller_of(pod)
    if ref is None:
        return False
    name = str((pod.get("metadata") or {}).get("name") or "")
    if ref.get("kind") == "StatefulSet" and ref.get("apiVersion") == "apps/v1":
        owner = workloads.stateful_sets.get(str(ref.get("uid") or ""))
        if owner is None or ref.get("name") != owner[0]:
            return False
        m = _ORDINAL.match(name)
        return m is not None and m["base"] == owner[0] and int(m["ordinal"]) < owner[1]
    if ref.get("kind") == "ReplicaSet" and ref.get("apiVersion") == "apps/v1":
        rs = str(ref.get("name") or "")
        return any(rs.startswith(f"{d}-") for d in workloads.router_deployments)
    return False
