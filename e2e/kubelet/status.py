"""Pod phase and conditions from container states, as pure functions.

Why: the pod status is the kubelet's whole contract with the rest of the cluster (EndpointSlices,
StatefulSet rollouts, the operator). Keeping the rules here, free of I/O, lets unit tests pin them:
phase follows the real kubelet's getPhase, Ready = ContainersReady AND every readinessGate True.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

OWN_CONDITIONS = ("PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready")


@dataclass
class ContainerView:
    """What the status needs to know about one container."""

    name: str
    image: str
    state: dict[str, Any]  # {"waiting": {...}} | {"running": {...}} | {"terminated": {...}}
    last_state: dict[str, Any] = field(default_factory=dict)
    ready: bool = False
    started: bool = False
    restart_count: int = 0
    container_id: str = ""

    def as_status(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "image": self.image,
            "imageID": f"local://{self.image}",
            "ready": self.ready,
            "started": self.started,
            "restartCount": self.restart_count,
            "state": self.state,
            "lastState": self.last_state,
        }
        if self.container_id:
            out["containerID"] = self.container_id
        return out


def phase(restart_policy: str, containers: list[ContainerView], initialized: bool) -> str:
    if not initialized:
        return "Pending"
    running = waiting = succeeded = failed = 0
    for c in containers:
        if "running" in c.state:
            running += 1
        elif "terminated" in c.state:
            if c.state["terminated"].get("exitCode", 1) == 0:
                succeeded += 1
            else:
                failed += 1
        elif c.restart_count > 0 or c.last_state:
            running += 1  # waiting to restart: the pod is still Running
        else:
            waiting += 1
    if waiting:
        return "Pending"
    if running:
        return "Running"
    if restart_policy == "Always":
        return "Running"
    if failed == 0:
        return "Succeeded"
    if restart_policy == "Never":
        return "Failed"
    return "Running"  # OnFailure: failed containers are about to restart


def gate_problems(pod: dict[str, Any]) -> list[str]:
    """Readiness gates whose condition is not True, with the real kubelet's wording."""
    conds = {c["type"]: c.get("status") for c in (pod.get("status") or {}).get("conditions") or []}
    problems = []
    for gate in pod["spec"].get("readinessGates") or []:
        t = gate["conditionType"]
        if t not in conds:
            problems.append(f'corresponding condition of pod readiness gate "{t}" does not exist.')
        elif conds[t] != "True":
            problems.append(f'the status of pod readiness gate "{t}" is not "True", but {conds[t]}')
    return problems


def conditions(
    pod: dict[str, Any], containers: list[ContainerView], initialized: bool, now: str
) -> list[dict[str, Any]]:
    """The kubelet-owned conditions, keeping lastTransitionTime when a status did not change."""
    old = {c["type"]: c for c in (pod.get("status") or {}).get("conditions") or []}
    p = phase(pod["spec"].get("restartPolicy") or "Always", containers, initialized)
    terminal = p in ("Succeeded", "Failed")
    not_ready = [c.name for c in containers if not c.ready]
    want: list[tuple[str, bool, str, str]] = [
        ("PodReadyToStartContainers", not terminal, "", ""),
        (
            "Initialized",
            initialized,
            "" if initialized else "ContainersNotInitialized",
            "" if initialized else "containers with incomplete status: init containers",
        ),
    ]
    if terminal:
        cr = (False, "PodCompleted", "")
    elif not_ready:
        cr = (
            False,
            "ContainersNotReady",
            f"containers with unready status: [{' '.join(not_ready)}]",
        )
    else:
        cr = (True, "", "")
    want.append(("ContainersReady", *cr))
    gates = gate_problems(pod)
    if not cr[0]:
        want.append(("Ready", *cr))
    elif gates:
        want.append(("Ready", False, "ReadinessGatesNotReady", "; ".join(gates)))
    else:
        want.append(("Ready", True, "", ""))
    out = []
    for type_, ok, reason, message in want:
        status = "True" if ok else "False"
        prev = old.get(type_)
        changed = not prev or prev.get("status") != status
        cond: dict[str, Any] = {
            "type": type_,
            "status": status,
            "lastProbeTime": None,
            "lastTransitionTime": now if changed else prev.get("lastTransitionTime", now),  # type: ignore[union-attr]
        }
        if reason:
            cond["reason"] = reason
        if message:
            cond["message"] = message
        out.append(cond)
    return out


def pod_status(
    pod: dict[str, Any],
    *,
    containers: list[ContainerView],
    init_containers: list[ContainerView],
    initialized: bool,
    pod_ip: str,
    host_ip: str,
    start_time: str,
    now: str,
) -> dict[str, Any]:
    """The status patch (strategic merge: conditions merge by type, others' gates survive)."""
    st: dict[str, Any] = {
        "phase": phase(pod["spec"].get("restartPolicy") or "Always", containers, initialized),
        "conditions": conditions(pod, containers, initialized, now),
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}],
        "startTime": start_time,
        "containerStatuses": [c.as_status() for c in containers],
        "qosClass": (pod.get("status") or {}).get("qosClass") or "BestEffort",
    }
    if init_containers:
        st["initContainerStatuses"] = [c.as_status() for c in init_containers]
    if pod_ip:
        st["podIP"] = pod_ip
        st["podIPs"] = [{"ip": pod_ip}]
    return st


def overwritten(pod: dict[str, Any], status: dict[str, Any]) -> bool:
    """Whether someone else changed a condition this kubelet owns on the API server (the node
    lifecycle controller marks a lost node's pods Ready False): a kubelet that speaks again
    writes its own view back, as a real one's status manager does."""
    held = {
        c.get("type"): c.get("status") for c in (pod.get("status") or {}).get("conditions") or []
    }
    return any(held.get(c["type"]) != c["status"] for c in status["conditions"])


def material(status: dict[str, Any]) -> Any:
    """The status without timestamps that change on every call, to skip no-op patches."""
    conds = [
        (c["type"], c["status"], c.get("reason"), c.get("message")) for c in status["conditions"]
    ]
    return (
        status["phase"],
        conds,
        status.get("podIP"),
        status["containerStatuses"],
        status.get("initContainerStatuses"),
    )
