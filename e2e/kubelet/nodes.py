"""Node objects for the local kubelet: registration, heartbeats (Lease + status), pod CIDRs.

Why: the scheduler only binds pods to Ready nodes with enough allocatable resources, and the node
lifecycle controller taints nodes whose Lease stops being renewed. We advertise GPU capacity as an
extended resource so `nvidia.com/gpu` requests are scheduled by the real kube-scheduler.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import platform
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pdwarden.constants import GROUP

from .apiclient import Api, ApiError

log = logging.getLogger("kubelet.nodes")

KUBELET_VERSION = "v1.35.4"
LEASE_SECONDS = 40
MANAGED_BY = f"{GROUP}/local-kubelet"


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_micro() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class NodeSpec:
    name: str
    gpus: int
    cpu: str = "32"
    memory: str = "256Gi"
    pods: str = "110"
    pod_cidr: str = ""  # filled from spec.podCIDR once the controller-manager allocated it
    labels: dict[str, str] = field(default_factory=dict)

    def capacity(self) -> dict[str, str]:
        cap = {
            "cpu": self.cpu,
            "memory": self.memory,
            "pods": self.pods,
            "ephemeral-storage": "500Gi",
        }
        if self.gpus:
            cap["nvidia.com/gpu"] = str(self.gpus)
        return cap


def node_manifest(spec: NodeSpec) -> dict[str, Any]:
    labels = {
        "kubernetes.io/hostname": spec.name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "node.kubernetes.io/instance-type": "local-gpu" if spec.gpus else "local-cpu",
        MANAGED_BY: "true",
        **({"nvidia.com/gpu.present": "true"} if spec.gpus else {}),
        **spec.labels,
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": spec.name, "labels": labels, "annotations": {MANAGED_BY: "true"}},
        "spec": {},
    }


def node_status(spec: NodeSpec, ready: bool = True, reason: str = "KubeletReady") -> dict[str, Any]:
    t = now_iso()

    def cond(type_: str, status: str, why: str, msg: str) -> dict[str, str]:
        return {
            "type": type_,
            "status": status,
            "reason": why,
            "message": msg,
            "lastHeartbeatTime": t,
            "lastTransitionTime": t,
        }

    return {
        "status": {
            "capacity": spec.capacity(),
            "allocatable": spec.capacity(),
            "conditions": [
                cond("MemoryPressure", "False", "KubeletHasSufficientMemory", "ok"),
                cond("DiskPressure", "False", "KubeletHasNoDiskPressure", "ok"),
                cond("PIDPressure", "False", "KubeletHasSufficientPID", "ok"),
                cond(
                    "Ready",
                    "True" if ready else "False",
                    reason,
                    "local kubelet is posting ready status" if ready else "local kubelet stopped",
                ),
            ],
            "addresses": [
                {"type": "InternalIP", "address": "127.0.0.1"},
                {"type": "Hostname", "address": spec.name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
            "nodeInfo": {
                "machineID": spec.name,
                "systemUUID": spec.name,
                "bootID": "local",
                "kernelVersion": platform.release(),
                "osImage": "pdwarden local kubelet (processes, no containers)",
                "containerRuntimeVersion": "local-process://1",
                "kubeletVersion": KUBELET_VERSION,
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        }
    }


async def register(api: Api, spec: NodeSpec) -> dict[str, Any]:
    """Create or adopt the Node, then post its status; returns the Node."""
    body = node_manifest(spec)
    try:
        node = await api.request("POST", "/api/v1/nodes", body=body)
        log.info("registered node %s", spec.name)
    except ApiError as e:
        if e.status != 409:
            raise
        node = await api.patch(f"/api/v1/nodes/{spec.name}", {"metadata": body["metadata"]})
        log.info("adopted existing node %s", spec.name)
    await post_status(api, spec)
    return dict(node)


async def post_status(
    api: Api, spec: NodeSpec, ready: bool = True, reason: str = "KubeletReady"
) -> None:
    # Conditions merge by type under a strategic merge patch.
    await api.patch(f"/api/v1/nodes/{spec.name}/status", node_status(spec, ready, reason))


async def renew_lease(api: Api, spec: NodeSpec, node_uid: str) -> None:
    path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{spec.name}"
    body = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": spec.name,
            "namespace": "kube-node-lease",
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Node", "name": spec.name, "uid": node_uid}
            ],
        },
        "spec": {
            "holderIdentity": spec.name,
            "leaseDurationSeconds": LEASE_SECONDS,
            "renewTime": now_micro(),
        },
    }
    try:
        await api.patch(path, {"spec": body["spec"]}, strategic=False, retries=1)
    except ApiError as e:
        if e.status != 404:
            raise
        await api.request(
            "POST", "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases", body=body
        )


async def heartbeat(
    api: Api, specs: list[NodeSpec], uids: dict[str, str], stop: asyncio.Event
) -> None:
    """Renew every node's Lease each 10 s and re-post status each 60 s, until `stop`."""
    tick = 0
    while not stop.is_set():
        for spec in specs:
            try:
                await renew_lease(api, spec, uids[spec.name])
                if tick % 6 == 5:
                    await post_status(api, spec)
            except ApiError as e:
                log.warning("heartbeat for %s failed: %s", spec.name, e)
        tick += 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 10)


async def wait_pod_cidr(api: Api, name: str, deadline_s: float) -> str:
    """spec.podCIDR as allocated by the controller-manager, or '' after the deadline."""
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline_s
    while True:
        node = await api.get_or_none(f"/api/v1/nodes/{name}")
        cidr = ((node or {}).get("spec") or {}).get("podCIDR") or ""
        if cidr or loop.time() > end:
            return str(cidr)
        await asyncio.sleep(0.5)
