"""Local kubelet lifecycle against the real control plane: volumes and env, liveness restarts,
memory limits the kernel enforces (OOMKilled), and that no pod process outlives a kubelet (clean
stop, or SIGKILL of the kubelet).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from e2e.fixtures import Cluster
from e2e.kubelet import memcg
from e2e.kubelet.logs import read_log
from e2e.tests.test_kubelet import alive, apply, condition, get, pid_of

pytestmark = pytest.mark.cluster

SCRIPT = (
    'cat /etc/cfg/greeting; echo " $GREETING/$TOKEN/$POD_NAME/$NODE"; '
    "cat /etc/podinfo/labels; echo; "
    "test -s /var/run/secrets/kubernetes.io/serviceaccount/token && echo token-ok; "
    'test -n "$KUBECONFIG" && echo kubeconfig-ok'
)


def env_from(name: str, **source: Any) -> dict[str, Any]:
    return {"name": name, "valueFrom": source}


def test_volumes_env_and_mount_paths(cluster: Cluster, namespace: str) -> None:
    if cluster.local is None:
        pytest.skip("reads the pod log from the local kubelet's state dir")
    apply(
        cluster,
        namespace,
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"},
         "data": {"greeting": "hello", "GREETING": "hi"}},
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "sec"},
         "stringData": {"token": "s3cr3t"}},
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "vols", "labels": {"app": "vols"}},
            "spec": {
                "restartPolicy": "Never",
                "containers": [{
                    "name": "c",
                    "image": "busybox",
                    "command": ["sh", "-c", SCRIPT],
                    "envFrom": [{"configMapRef": {"name": "cfg"}}],
                    "env": [
                        env_from("TOKEN", secretKeyRef={"name": "sec", "key": "token"}),
                        env_from("POD_NAME", fieldRef={"fieldPath": "metadata.name"}),
                        env_from("NODE", fieldRef={"fieldPath": "spec.nodeName"}),
                    ],
                    "volumeMounts": [
                        {"name": "cfg", "mountPath": "/etc/cfg"},
                        {"name": "info", "mountPath": "/etc/podinfo"},
                    ],
                }],
                "volumes": [
                    {"name": "cfg", "configMap": {"name": "cfg"}},
                    {"name": "info", "downwardAPI": {"items": [
                        {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}},
                ],
            },
        },
    )  # fmt: skip

    def phase() -> str:
        return str(
            ((get(cluster, namespace, "pod", "vols") or {}).get("status") or {}).get("phase")
        )

    cluster.wait_until("vols to finish", lambda: phase() in ("Succeeded", "Failed"), timeout=60)
    log = read_log(cluster.local.directory / "kubelet", namespace, "vols")
    assert phase() == "Succeeded", log
    pod = get(cluster, namespace, "pod", "vols")
    lines = log.splitlines()
    assert lines[0] == f"hello hi/s3cr3t/vols/{pod['spec']['nodeName']}"
    assert 'app="vols"' in log
    assert "token-ok" in log and "kubeconfig-ok" in log


def test_liveness_failure_restarts_container(cluster: Cluster, namespace: str) -> None:
    apply(
        cluster,
        namespace,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "sick"},
            "spec": {
                "terminationGracePeriodSeconds": 1,
                "containers": [{
                    "name": "c",
                    "image": "python:3.11",
                    "command": ["python", "-c", "import time; time.sleep(3600)"],
                    "livenessProbe": {"exec": {"command": ["sh", "-c", "exit 1"]},
                                      "periodSeconds": 1, "failureThreshold": 2},
                }],
            },
        },
    )  # fmt: skip

    def status() -> dict[str, Any]:
        p = get(cluster, namespace, "pod", "sick") or {}
        return dict(((p.get("status") or {}).get("containerStatuses") or [{}])[0])

    cluster.wait_until(
        "a liveness restart", lambda: status().get("restartCount", 0) >= 1, timeout=40
    )
    last = status()["lastState"]["terminated"]
    assert "liveness probe failed" in last.get("message", ""), last


def test_a_container_over_its_memory_limit_is_oom_killed_and_one_under_it_runs(
    cluster: Cluster, namespace: str
) -> None:
    """The kernel's OOM killer, through the container's own memory cgroup: the container that
    allocates past `limits.memory` ends OOMKilled (137) and is restarted; its twin that stays
    under the same limit keeps running."""
    if not memcg.available():
        pytest.skip("no memory cgroup can be made on this machine: limits are not enforced")
    grab = "import time; b = [bytearray({mib} << 20) for _ in range(4)]; print('held'); " \
           "time.sleep(3600)"  # fmt: skip
    for name, mib in (("greedy", 32), ("modest", 4)):
        apply(cluster, namespace, {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"terminationGracePeriodSeconds": 1, "containers": [{
                "name": "c", "image": "python:3.11",
                "command": ["python", "-c", grab.format(mib=mib)],
                "resources": {"limits": {"memory": "64Mi"}},
            }]},
        })  # fmt: skip

    def status(name: str) -> dict[str, Any]:
        p = get(cluster, namespace, "pod", name) or {}
        return dict(((p.get("status") or {}).get("containerStatuses") or [{}])[0])

    cluster.wait_until("an OOM kill", lambda: status("greedy").get("restartCount", 0) >= 1, 60)
    last = status("greedy")["lastState"]["terminated"]
    assert (last["reason"], last["exitCode"]) == ("OOMKilled", 137), last
    modest = cluster.wait_until("the modest pod running", lambda: "running" in (
        status("modest").get("state") or {}) and status("modest"), 30)  # fmt: skip
    assert modest["restartCount"] == 0, modest


def start_kubelet(cluster: Cluster, state: Path, prefix: str) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "e2e.kubelet", f"--kubeconfig={cluster.kubeconfig}",
            f"--state-dir={state}", "--gpu-nodes=1", "--cpu-nodes=0", f"--node-prefix={prefix}",
            "--shutdown-grace=3"]  # fmt: skip
    log = open(state.parent / f"{prefix}kubelet.log", "wb")  # noqa: SIM115 - lives with the process
    return subprocess.Popen(argv, stdout=log, stderr=log, cwd=Path(__file__).parents[2])


def pinned_pod(node: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "pinned"},
        "spec": {
            "nodeName": node,  # bypass the scheduler: this node belongs to the extra kubelet
            "terminationGracePeriodSeconds": 2,
            "containers": [{"name": "c", "image": "python:3.11",
                            "command": ["python", "-c", "import time; time.sleep(3600)"]}],
        },
    }  # fmt: skip


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
def test_no_pod_process_outlives_the_kubelet(
    cluster: Cluster, namespace: str, tmp_path: Path, how: str
) -> None:
    prefix = f"k{uuid.uuid4().hex[:6]}-"
    node = f"{prefix}gpu-node-0"
    kubelet = start_kubelet(cluster, tmp_path / "state", prefix)
    try:
        cluster.wait_until(
            f"{node} Ready", lambda: condition(get(cluster, "", "node", node), "Ready") == "True"
        )
        apply(cluster, namespace, pinned_pod(node))

        def running() -> dict[str, Any] | None:
            p = get(cluster, namespace, "pod", "pinned")
            return p if p and (p.get("status") or {}).get("phase") == "Running" else None

        cluster.wait_until("pinned Running", running, timeout=30)
        pid = pid_of(running() or {})
        assert alive(pid)
        t = time.monotonic()
        kubelet.send_signal(signal.SIGTERM if how == "sigterm" else signal.SIGKILL)
        rc = kubelet.wait(timeout=30)
        cluster.wait_until("pod process gone", lambda: not alive(pid), timeout=10)
        if how == "sigterm":
            assert rc == 0, f"kubelet exited with {rc}"
            assert time.monotonic() - t < 20
            assert condition(get(cluster, "", "node", node), "Ready") == "False"
    finally:
        if kubelet.poll() is None:
            kubelet.kill()
            kubelet.wait()
        cluster.kubectl("delete", "pod", "pinned", "-n", namespace, "--grace-period=0", "--force",
                        check=False)  # fmt: skip
        cluster.kubectl("delete", "node", node, "--wait=false", check=False)
    assert not os.path.exists(f"/proc/{pid}") or not alive(pid)
