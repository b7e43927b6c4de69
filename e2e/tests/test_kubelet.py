"""The local kubelet against the real control plane: nodes, pods as processes, readiness, RBAC.

These are the "Done when" checks of issue 3 that need a running cluster (fixture `cluster`).
"""

from __future__ import annotations

import json
import os
import textwrap
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e.fixtures import Cluster
from e2e.kubelet.logs import read_log

from pdwarden.constants import CONDITION_SERVING

pytestmark = pytest.mark.cluster

GATE = CONDITION_SERVING


def apply(cluster: Cluster, ns: str, *docs: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump_all(docs))


def get(cluster: Cluster, ns: str, *what: str) -> Any:
    out = cluster.kubectl("get", "-n", ns, *what, "-o", "json", check=False)
    return json.loads(out.stdout) if out.returncode == 0 else None


def pods(cluster: Cluster, ns: str, selector: str) -> list[dict[str, Any]]:
    return list((get(cluster, ns, "pods", "-l", selector) or {"items": []})["items"])


def condition(pod: dict[str, Any] | None, type_: str) -> str | None:
    for c in ((pod or {}).get("status") or {}).get("conditions") or []:
        if c["type"] == type_:
            return str(c["status"])
    return None


def pid_of(pod: dict[str, Any]) -> int:
    cid = pod["status"]["containerStatuses"][0]["containerID"]
    assert cid.startswith("local://"), cid
    return int(cid.removeprefix("local://"))


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def http_ok(ip: str, port: int = 8080) -> bool:
    try:
        with urllib.request.urlopen(f"http://{ip}:{port}/", timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def http_server(name: str, replicas: int, gates: bool = False) -> list[dict[str, Any]]:
    """A Service and a StatefulSet of `python -m http.server` bound to the pod IP."""
    pod_spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": 5,
        "containers": [
            {
                "name": "web",
                "image": "python:3.11",
                "command": ["python", "-m", "http.server", "--bind", "$(POD_IP)", "8080"],
                "env": [
                    {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
                ],
                "ports": [{"name": "http", "containerPort": 8080}],
                "readinessProbe": {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 1},
            }
        ],
    }
    if gates:
        pod_spec["readinessGates"] = [{"conditionType": GATE}]
    return [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": name},
            "spec": {"selector": {"app": name}, "ports": [{"port": 8080, "name": "http"}]},
        },
        {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {"name": name},
            "spec": {
                "replicas": replicas,
                "serviceName": name,
                "podManagementPolicy": "Parallel",
                "selector": {"matchLabels": {"app": name}},
                "template": {"metadata": {"labels": {"app": name}}, "spec": pod_spec},
            },
        },
    ]


def ready_pods(cluster: Cluster, ns: str, app: str, n: int) -> list[dict[str, Any]]:
    got: list[dict[str, Any]] = []

    def check() -> bool:
        got[:] = [p for p in pods(cluster, ns, f"app={app}") if condition(p, "Ready") == "True"]
        return len(got) == n

    cluster.wait_until(f"{n} Ready pods of {app}", check, timeout=60)
    return got


def test_nodes_ready_with_gpus(cluster: Cluster) -> None:
    nodes = {n["metadata"]["name"]: n for n in get(cluster, "default", "nodes")["items"]}
    for name in ("gpu-node-0", "gpu-node-1", "cpu-node-0"):
        assert condition(nodes[name], "Ready") == "True", name
        assert nodes[name]["spec"].get("podCIDR"), f"{name} has no pod CIDR"
        addrs = {a["type"]: a["address"] for a in nodes[name]["status"]["addresses"]}
        assert addrs["InternalIP"] == "127.0.0.1"
    assert nodes["gpu-node-0"]["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    assert "nvidia.com/gpu" not in nodes["cpu-node-0"]["status"]["allocatable"]
    lease = get(cluster, "kube-node-lease", "lease", "gpu-node-1")
    assert lease["spec"]["holderIdentity"] == "gpu-node-1"


def test_statefulset_pods_serve_http_and_are_recreated(cluster: Cluster, namespace: str) -> None:
    apply(cluster, namespace, *http_server("web", 2))
    web = ready_pods(cluster, namespace, "web", 2)
    ips = {p["status"]["podIP"] for p in web}
    assert len(ips) == 2, f"pod IPs not distinct: {ips}"
    for ip in ips:
        assert http_ok(ip), f"no HTTP answer from {ip}"

    old = next(p for p in web if p["metadata"]["name"] == "web-0")
    old_pid = pid_of(old)
    assert alive(old_pid)
    cluster.kubectl("delete", "pod", "web-0", "-n", namespace, "--wait=false")
    cluster.wait_until("old web-0 process to exit", lambda: not alive(old_pid), timeout=30)

    def recreated() -> bool:
        p = get(cluster, namespace, "pod", "web-0")
        return bool(p and p["metadata"]["uid"] != old["metadata"]["uid"] and
                    condition(p, "Ready") == "True")  # fmt: skip

    cluster.wait_until("web-0 recreated and Ready", recreated, timeout=60)
    new = get(cluster, namespace, "pod", "web-0")
    assert pid_of(new) != old_pid and alive(pid_of(new))
    assert http_ok(new["status"]["podIP"])

    pids = [pid_of(p) for p in pods(cluster, namespace, "app=web")]
    cluster.kubectl("delete", "statefulset", "web", "-n", namespace, "--wait=false")
    cluster.wait_until(
        "StatefulSet pods garbage-collected",
        lambda: not pods(cluster, namespace, "app=web"),
        timeout=60,
    )
    assert not [p for p in pids if alive(p)], "pod processes outlived their pods"


def test_pod_asking_too_many_gpus_stays_pending(cluster: Cluster, namespace: str) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "greedy"},
        "spec": {
            "containers": [
                {
                    "name": "c",
                    "image": "pdworker:dev",
                    "resources": {"limits": {"nvidia.com/gpu": "9"}},
                }
            ]
        },
    }
    apply(cluster, namespace, pod)

    def unschedulable() -> str:
        p = get(cluster, namespace, "pod", "greedy")
        for c in (p or {}).get("status", {}).get("conditions") or []:
            if c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable":
                return str(c.get("message", ""))
        return ""

    cluster.wait_until("PodScheduled=False/Unschedulable", unschedulable, timeout=30)
    assert "Insufficient nvidia.com/gpu" in unschedulable()
    p = get(cluster, namespace, "pod", "greedy")
    assert p["status"]["phase"] == "Pending" and not p["spec"].get("nodeName")


def test_readiness_gate_controls_endpointslice(cluster: Cluster, namespace: str) -> None:
    apply(cluster, namespace, *http_server("gated", 1, gates=True))

    def pod() -> dict[str, Any]:
        return dict(get(cluster, namespace, "pod", "gated-0") or {})

    cluster.wait_until(
        "gated-0 ContainersReady", lambda: condition(pod(), "ContainersReady") == "True"
    )
    assert condition(pod(), "Ready") == "False", "Ready despite a missing readiness gate"
    ip = pod()["status"]["podIP"]

    def set_gate(status: str) -> None:
        patch = {"status": {"conditions": [{"type": GATE, "status": status}]}}
        cluster.kubectl("patch", "pod", "gated-0", "-n", namespace, "--subresource=status",
                        "--type=strategic", "-p", json.dumps(patch))  # fmt: skip

    def endpoint_ready() -> bool | None:
        slices = get(cluster, namespace, "endpointslices", "-l", "kubernetes.io/service-name=gated")
        for s in (slices or {}).get("items", []):
            for ep in s.get("endpoints") or []:
                if ip in ep["addresses"]:
                    return bool(ep["conditions"].get("ready"))
        return None

    # The API server refuses 127/8 addresses in EndpointSlices (ValidateEndpointIP), so with the
    # loopback pod network only the pod's own Ready condition can be checked.
    slices = not ip.startswith("127.")
    set_gate("True")
    cluster.wait_until("pod Ready with gate True", lambda: condition(pod(), "Ready") == "True")
    if slices:
        cluster.wait_until("endpoint ready", lambda: endpoint_ready() is True)
    set_gate("False")
    cluster.wait_until("pod NotReady with gate False", lambda: condition(pod(), "Ready") == "False")
    assert condition(pod(), "ContainersReady") == "True"
    if slices:
        cluster.wait_until("endpoint not ready", lambda: endpoint_ready() is False)
    set_gate("True")
    cluster.wait_until("pod Ready again", lambda: condition(pod(), "Ready") == "True")
    if slices:
        cluster.wait_until("endpoint ready again", lambda: endpoint_ready() is True)
    else:
        pytest.xfail("loopback pod IPs: EndpointSlices cannot list them (pod Ready part passed)")


RBAC_CHECK = textwrap.dedent(
    """
    import sys
    from kubernetes import client, config
    from kubernetes.client.rest import ApiException
    config.load_kube_config()
    v1 = client.CoreV1Api()
    ns = sys.argv[1]
    names = [p.metadata.name for p in v1.list_namespaced_pod(ns).items]
    print("pods:", names)
    try:
        v1.list_namespaced_secret(ns)
        print("secrets: allowed (WRONG)")
        sys.exit(1)
    except ApiException as e:
        print("secrets:", e.status)
        sys.exit(0 if e.status == 403 else 2)
    """
)


def test_service_account_gets_its_rbac(cluster: Cluster, namespace: str) -> None:
    apply(
        cluster,
        namespace,
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "reader"}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "pod-reader"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "reader"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "pod-reader",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}],
        },
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "rbac-check"},
            "spec": {
                "serviceAccountName": "reader",
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": "check",
                        "image": "python:3.11",
                        "command": ["python", "-c", RBAC_CHECK, namespace],
                    }
                ],
            },
        },
    )

    def phase() -> str:
        return str(
            ((get(cluster, namespace, "pod", "rbac-check") or {}).get("status") or {}).get("phase")
        )

    cluster.wait_until(
        "rbac-check to finish", lambda: phase() in ("Succeeded", "Failed"), timeout=60
    )
    log = ""
    if cluster.local is not None:
        log = read_log(cluster.local.directory / "kubelet", namespace, "rbac-check")
    assert phase() == "Succeeded", f"RBAC check failed:\n{log}"
    if log:
        assert "rbac-check" in log and "secrets: 403" in log


def test_crashing_container_restarts_with_backoff(cluster: Cluster, namespace: str) -> None:
    apply(
        cluster,
        namespace,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "crasher"},
            "spec": {
                "containers": [{"name": "c", "image": "busybox", "command": ["sh", "-c", "exit 3"]}]
            },
        },
    )

    def status() -> dict[str, Any]:
        p = get(cluster, namespace, "pod", "crasher") or {}
        return dict(((p.get("status") or {}).get("containerStatuses") or [{}])[0])

    cluster.wait_until(
        "CrashLoopBackOff",
        lambda: status().get("state", {}).get("waiting", {}).get("reason") == "CrashLoopBackOff",
        timeout=40,
    )
    s = status()
    assert s["restartCount"] >= 1
    assert s["lastState"]["terminated"]["exitCode"] == 3


def test_unknown_image_fails_clearly(cluster: Cluster, namespace: str) -> None:
    apply(
        cluster,
        namespace,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "nginx"},
            "spec": {"containers": [{"name": "c", "image": "nginx:1.27"}]},
        },
    )

    def waiting() -> dict[str, Any]:
        p = get(cluster, namespace, "pod", "nginx") or {}
        st = ((p.get("status") or {}).get("containerStatuses") or [{}])[0]
        return dict(st.get("state", {}).get("waiting") or {})

    cluster.wait_until("ImageNotMapped", lambda: waiting().get("reason") == "ImageNotMapped")
    assert "nginx" in waiting()["message"]
