"""The worker NetworkPolicy, judged by whom it admits: who reaches a prefill/decode pod, on
which port.

Pure: `admits` below applies the networking.k8s.io/v1 semantics (a peer's podSelector alone selects
in the policy's namespace, namespaceSelector alone every pod of the selected namespaces, both
together the selected pods of the selected namespaces; a rule without `ports` covers every port) to
the object render/network_policy.py produces. No network plugin here enforces NetworkPolicy;
tests/install/test_install_cluster.py checks the object the API server holds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from pdwarden.api import parse_spec
from pdwarden.constants import WORKER_PORT
from pdwarden.render import Owner, render_deployment
from pdworker.contract import DEFAULT_BOOTSTRAP_PORT

ROOT = Path(__file__).resolve().parents[2]
OWNER = Owner(name="demo", namespace="team-a", uid="uid-1")
OPERATOR_NS = "pdw-system"
WORKER, BOOTSTRAP, NIXL = WORKER_PORT, DEFAULT_BOOTSTRAP_PORT, 41234
OPERATOR_LABELS = {
    "app.kubernetes.io/part-of": "pdwarden",
    "app.kubernetes.io/component": "operator",
}


@dataclass(frozen=True)
class Pod:
    namespace: str
    labels: dict[str, str] = field(default_factory=dict)
    namespace_labels: dict[str, str] = field(default_factory=dict)

    def ns_labels(self) -> dict[str, str]:
        # the API server labels every namespace with its name
        return {**self.namespace_labels, "kubernetes.io/metadata.name": self.namespace}


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for req in selector.get("matchExpressions", []):
        key, op, values = req["key"], req["operator"], req.get("values", [])
        ok = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not ok:
            return False
    return True


def _peer_matches(peer: dict[str, Any], source: Pod, policy_ns: str) -> bool:
    if "namespaceSelector" in peer:
        in_namespace = _selects(peer["namespaceSelector"], source.ns_labels())
    else:
        in_namespace = source.namespace == policy_ns
    return in_namespace and _selects(peer.get("podSelector", {}), source.labels)


def admits(policy: dict[str, Any], source: Pod, port: int) -> bool:
    """Whether `policy` lets `source` reach a pod it selects on `port`."""
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    ns = policy["metadata"]["namespace"]
    for rule in policy["spec"]["ingress"]:
        ports = [p["port"] for p in rule.get("ports", [])]
        if ports and port not in ports:
            continue
        peers = rule.get("from", [])
        if not peers or any(_peer_matches(p, source, ns) for p in peers):
            return True
    return False


def spec(**patch: Any) -> Any:
    doc = yaml.safe_load((ROOT / "manifests" / "examples" / "minimal-cpu.yaml").read_text())
    return parse_spec({**doc["spec"], **patch})


def worker_policy(operator_namespace: str | None = OPERATOR_NS, **patch: Any) -> dict[str, Any]:
    objs = render_deployment(OWNER, spec(**patch), operator_namespace)
    (pol,) = [o for o in objs if o["kind"] == "NetworkPolicy"]
    return pol


def deployment_pod(name: str = "demo", namespace: str = "team-a", role: str = "router") -> Pod:
    return Pod(namespace, {"pdwarden.dev/deployment": name, "pdwarden.dev/role": role})


def test_policy_selects_the_deployments_prefill_and_decode_pods_only() -> None:
    selected = worker_policy()["spec"]["podSelector"]
    for role in ("prefill", "decode"):
        assert _selects(selected, deployment_pod(role=role).labels)
    assert not _selects(selected, deployment_pod(role="router").labels)  # the front door
    assert not _selects(selected, deployment_pod(name="other", role="decode").labels)


def test_own_router_and_peers_reach_every_port_from_the_same_namespace_only() -> None:
    pol = worker_policy()
    for port in (WORKER, BOOTSTRAP, NIXL):
        assert admits(pol, deployment_pod(), port)
        assert admits(pol, deployment_pod(role="decode"), port)
        # the same labels in another tenant's namespace: not the same deployment
        assert not admits(pol, deployment_pod(namespace="team-b"), port)
    assert not admits(pol, deployment_pod(name="other"), WORKER)
    assert not admits(pol, Pod("team-a", {"pdwarden.dev/deployment": "other"}), WORKER)


def test_operator_reaches_the_worker_port_only_from_its_own_namespace() -> None:
    pol = worker_policy()
    operator = Pod(OPERATOR_NS, dict(OPERATOR_LABELS))
    assert admits(pol, operator, WORKER)
    assert not admits(pol, operator, BOOTSTRAP)
    assert not admits(pol, operator, NIXL)
    # A tenant's pod dressed as the operator, in its own namespace or the workers': refused.
    for ns in ("team-b", "team-a"):
        assert not admits(pol, Pod(ns, dict(OPERATOR_LABELS)), WORKER), ns
    # An unlabelled pod in the operator's namespace is not the operator either.
    assert not admits(pol, Pod(OPERATOR_NS, {"app": "something"}), WORKER)


def test_no_rule_admits_every_namespace() -> None:
    pol = worker_policy(network={"allowFrom": [
        {"podSelector": {"matchLabels": {"app": "gateway"}}},
        {"namespaceSelector": {"matchLabels": {"team": "edge"}},
         "podSelector": {"matchLabels": {"app": "epp"}}},
    ]})  # fmt: skip
    for rule in pol["spec"]["ingress"]:
        assert rule["from"], rule
        for peer in rule["from"]:
            assert peer.get("namespaceSelector", {"x": 1}) != {}, peer
            assert peer.get("podSelector", {"x": 1}) != {} or "namespaceSelector" in peer, peer


def test_outside_the_cluster_the_operator_is_admitted_from_nowhere() -> None:
    pol = worker_policy(operator_namespace=None)
    for ns in (OPERATOR_NS, "team-a", "team-b"):
        assert not admits(pol, Pod(ns, dict(OPERATOR_LABELS)), WORKER)
    assert admits(pol, deployment_pod(), WORKER)  # the deployment itself still works


def test_allow_from_admits_the_listed_gateways_on_the_worker_port_only() -> None:
    gateways = [
        {"podSelector": {"matchLabels": {"app": "gateway"}}},
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "edge"}},
         "podSelector": {"matchExpressions": [{"key": "app", "operator": "In",
                                               "values": ["epp", "envoy"]}]}},
        {"namespaceSelector": {"matchLabels": {"team": "infer"}}},
    ]  # fmt: skip
    pol = worker_policy(network={"allowFrom": gateways})
    # rendered exactly as written (NetworkPolicyPeer's own shape), nothing added
    assert pol["spec"]["ingress"][-1] == {
        "from": gateways,
        "ports": [{"protocol": "TCP", "port": WORKER}],
    }
    admitted = [
        Pod("team-a", {"app": "gateway"}),  # podSelector alone: the deployment's namespace
        Pod("edge", {"app": "envoy"}),
        Pod("infer", {"anything": "x"}, {"team": "infer"}),
    ]
    refused = [
        Pod("team-b", {"app": "gateway"}),  # same labels, another namespace
        Pod("edge", {"app": "gateway"}),
        Pod("other", {"app": "epp"}, {"team": "edge"}),
    ]
    for pod in admitted:
        assert admits(pol, pod, WORKER), pod
        assert not admits(pol, pod, BOOTSTRAP), pod
        assert not admits(pol, pod, NIXL), pod
    for pod in refused:
        assert not admits(pol, pod, WORKER), pod
    # without allowFrom none of them gets in
    for pod in admitted:
        assert not admits(worker_policy(), pod, WORKER), pod
