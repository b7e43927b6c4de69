"""Label cordon and eviction on pods of a real StatefulSet, against the local control plane.

The pods are owned by a plain StatefulSet (kube-controller-manager's own controller) and run by
the local kubelet as `sh` processes; a real Service, EndpointSlice controller and disruption
controller decide what a cordon label and an eviction do. Nothing of pdwarden runs except the
adapter functions under test (pdwarden.k8s.foreign) and the pure decisions they call.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from e2e.fixtures import Cluster
from kubernetes import config as k8s_config

from pdwarden.api import CordonSpec
from pdwarden.constants import LABEL_SERVING
from pdwarden.k8s.client import KubeClient
from pdwarden.k8s.foreign import (
    evict_pod,
    service_selector,
    set_pod_label,
)
from pdwarden.remediation.act.pod_label import label_patch
from pdwarden.remediation.decide import PlannedAction
from pdwarden.remediation.policy.cordon import cordon_check
from pdwarden.remediation.policy.scope import foreign_pod
from pdwarden.values import LabelPatch

pytestmark = pytest.mark.cluster
KEY = LABEL_SERVING
LABELS = {"app": "sg", "role": "decode"}


def _objects(replicas: int) -> str:
    sts = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "sg-decode"},
        "spec": {
            "replicas": replicas,
            "serviceName": "sg-decode",
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": LABELS},
            "template": {
                "metadata": {"labels": {**LABELS, KEY: "true"}},
                "spec": {
                    "terminationGracePeriodSeconds": 1,
                    "containers": [
                        {
                            "name": "engine",
                            "image": "busybox",
                            "command": ["sh", "-c", "exec sleep 3600"],
                            "ports": [{"containerPort": 30000, "name": "http"}],
                        }
                    ],
                },
            },
        },
    }
    service = {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "sg-decode"},
        "spec": {"selector": {**LABELS, KEY: "true"},
                 "ports": [{"port": 30000, "targetPort": 30000}]},
    }  # fmt: skip
    return yaml.safe_dump_all([sts, service])


@pytest.fixture
def kube(cluster: Cluster) -> Iterator[KubeClient]:
    api = k8s_config.new_client_from_config(config_file=cluster.kubeconfig)  # type: ignore[no-untyped-call]
    yield KubeClient(api)
    api.close()


def _pods(cluster: Cluster, ns: str) -> dict[str, dict[str, Any]]:
    out = cluster.kubectl("get", "pods", "-n", ns, "-l", "app=sg,role=decode", "-o", "json")
    return {p["metadata"]["name"]: p for p in json.loads(out.stdout)["items"]}


def _ready_pods(cluster: Cluster, ns: str, count: int) -> dict[str, dict[str, Any]]:
    def ready() -> dict[str, dict[str, Any]]:
        pods = _pods(cluster, ns)
        good = {n: p for n, p in pods.items() if foreign_pod(p).ready and p["status"].get("podIP")}
        return good if len(good) == count else {}

    return cluster.wait_until(f"{count} ready decode pods", ready, timeout=120)


def _endpoint_pods(cluster: Cluster, ns: str) -> set[str]:
    """The pods the Service sends traffic to.

    EndpointSlices when the pods have routable IPs. With the local kubelet's loopback pod
    network the API server refuses 127/8 addresses in EndpointSlices (ValidateEndpointIP, see
    e2e/kubelet/podips.py), so there the Service's own selector is evaluated by the API server,
    which is the selection the EndpointSlice controller makes.
    """
    pods = _pods(cluster, ns)
    if any(p["status"].get("podIP", "").startswith("127.") for p in pods.values()):
        svc = json.loads(
            cluster.kubectl("get", "service", "sg-decode", "-n", ns, "-o", "json").stdout
        )
        selector = ",".join(f"{k}={v}" for k, v in svc["spec"]["selector"].items())
        out = cluster.kubectl("get", "pods", "-n", ns, "-l", selector, "-o", "json")
        return {
            p["metadata"]["name"]
            for p in json.loads(out.stdout)["items"]
            if foreign_pod(p).ready and not foreign_pod(p).terminating
        }
    out = cluster.kubectl("get", "endpointslices", "-n", ns,
                          "-l", "kubernetes.io/service-name=sg-decode", "-o", "json")  # fmt: skip
    names = set()
    for eps in json.loads(out.stdout)["items"]:
        for ep in eps.get("endpoints") or []:
            if (ep.get("conditions") or {}).get("ready") and ep.get("targetRef"):
                names.add(ep["targetRef"]["name"])
    return names


def test_label_cordon_takes_the_pod_out_of_the_service_and_back(
    cluster: Cluster, namespace: str, kube: KubeClient
) -> None:
    ns = namespace
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=_objects(2))
    pods = _ready_pods(cluster, ns, 2)
    cluster.wait_until("both pods behind the Service",
                       lambda: _endpoint_pods(cluster, ns) == set(pods))  # fmt: skip
    spec = CordonSpec.model_validate({"serviceRef": {"name": "sg-decode"}})
    selector = asyncio.run(service_selector(kube, ns, "sg-decode"))
    assert cordon_check(spec, selector).unavailable is False
    assert asyncio.run(service_selector(kube, ns, "nope")) is None

    target = foreign_pod(pods["sg-decode-0"])
    patch = label_patch(
        PlannedAction("CordonDecode", target.name, "stalled", uid=target.uid), target, spec
    )
    assert patch is not None
    assert asyncio.run(set_pod_label(kube, ns, patch)) == "Patched"
    cluster.wait_until("the cordoned pod to leave the Service's endpoints",
                       lambda: _endpoint_pods(cluster, ns) == {"sg-decode-1"})  # fmt: skip
    # The same patch again carries a resourceVersion that is no longer current: refused.
    assert asyncio.run(set_pod_label(kube, ns, patch)) == "Conflict"
    # A patch for another incarnation (uid) is refused too, whatever its resourceVersion.
    stranger = LabelPatch(target.name, "00000000-0000-0000-0000-000000000000", "", KEY, "true")
    assert asyncio.run(set_pod_label(kube, ns, stranger)) == "Conflict"
    assert _pods(cluster, ns)["sg-decode-0"]["metadata"]["labels"][KEY] == "false"

    now = foreign_pod(_pods(cluster, ns)["sg-decode-0"])
    back = label_patch(PlannedAction("UncordonDecode", now.name, "healthy", uid=now.uid), now, spec)
    assert back is not None and asyncio.run(set_pod_label(kube, ns, back)) == "Patched"
    cluster.wait_until("the pod back behind the Service",
                       lambda: _endpoint_pods(cluster, ns) == set(pods))  # fmt: skip
    gone = LabelPatch("sg-decode-9", target.uid, "", KEY, "false")
    assert asyncio.run(set_pod_label(kube, ns, gone)) == "Gone"


def test_eviction_held_back_by_a_pdb_then_allowed_and_the_owner_recreates_the_pod(
    cluster: Cluster, namespace: str, kube: KubeClient
) -> None:
    ns = namespace
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=_objects(2))
    pods = _ready_pods(cluster, ns, 2)
    pdb = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
           "metadata": {"name": "sg-decode"},
           "spec": {"minAvailable": 2, "selector": {"matchLabels": LABELS}}}  # fmt: skip
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(pdb))

    def pdb_status() -> dict[str, Any]:
        out = cluster.kubectl("get", "pdb", "sg-decode", "-n", ns, "-o", "json")
        got: dict[str, Any] = json.loads(out.stdout).get("status") or {}
        return got

    cluster.wait_until("the disruption controller to count the pods",
                       lambda: pdb_status().get("currentHealthy") == 2)  # fmt: skip
    target = foreign_pod(pods["sg-decode-1"])
    held = asyncio.run(evict_pod(kube, ns, target.name, target.uid))
    assert held.result == "HeldBack"
    assert held.reason.startswith("PodDisruptionBudget: ") and "disruption budget" in held.reason
    assert _pods(cluster, ns)["sg-decode-1"]["metadata"]["uid"] == target.uid  # untouched

    cluster.kubectl("patch", "pdb", "sg-decode", "-n", ns, "--type=merge",
                    "-p", json.dumps({"spec": {"minAvailable": 1}}))  # fmt: skip
    cluster.wait_until("the PDB to allow one disruption",
                       lambda: pdb_status().get("disruptionsAllowed") == 1)  # fmt: skip
    evicted = asyncio.run(evict_pod(kube, ns, target.name, target.uid))
    assert (evicted.result, evicted.reason) == ("Evicted", "")

    def recreated() -> bool:
        pod = _pods(cluster, ns).get("sg-decode-1")
        return bool(pod and pod["metadata"]["uid"] != target.uid and foreign_pod(pod).ready)

    cluster.wait_until("the StatefulSet to recreate the evicted pod", recreated, timeout=120)
    fresh = _pods(cluster, ns)["sg-decode-1"]
    assert fresh["metadata"]["labels"][KEY] == "true"  # the template's serving label
    cluster.wait_until("the PDB to allow one disruption again",
                       lambda: pdb_status().get("disruptionsAllowed") == 1)  # fmt: skip
    # A plan made before the restart names the old incarnation: the new pod is never evicted.
    # (Note: the API server charges the PDB before it checks the uid, so a stale eviction still
    # uses the budget until the disruption controller releases it; re-read pods before evicting.)
    stale = asyncio.run(evict_pod(kube, ns, target.name, target.uid))
    assert stale.result == "Gone" and "precondition" in stale.reason.lower()
    assert _pods(cluster, ns)["sg-decode-1"]["metadata"]["uid"] == fresh["metadata"]["uid"]
    assert asyncio.run(evict_pod(kube, ns, "sg-decode-9", target.uid)).result == "Gone"
