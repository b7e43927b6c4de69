"""The NetworkPolicy each PDDeployment gets for its prefill and decode pods.

Why a module of its own: who may reach a worker is a security boundary, not a detail of the pod
template. Worker pods serve `/generate` (unauthenticated), the admin API (bearer token) and
/metrics on the worker port and the KV bootstrap server on the bootstrap port; NIXL/UCX between
prefill and decode uses ports chosen at run time. So the policy admits, on every port, only pods
of this deployment (its `pdwarden.dev/deployment` value, in its own namespace: its router and
peer workers); on the worker port only, the pdwarden operator's pods (by their labels AND the
operator's namespace, so a look-alike pod in a tenant's namespace is not admitted) and the
gateways the spec lists in `network.allowFrom`. The router is left unselected: it is the front
door. Policies are additive: the chart's `networkPolicy.extraFrom` adds one more (e.g.
Prometheus); see SECURITY.md.
"""

from __future__ import annotations

from collections.abc import Sequence

from pdwarden.api import NetworkPeer
from pdwarden.api.network import NAMESPACE_NAME_LABEL
from pdwarden.constants import LABEL_DEPLOYMENT, LABEL_ROLE, ROLE_DECODE, ROLE_PREFILL, WORKER_PORT
from pdwarden.render.common import Obj, Owner, metadata

# The labels every operator pod of the Helm chart carries (helm/pdwarden/templates/_helpers.tpl,
# pdwarden.selectorLabels + pdwarden.labels).
OPERATOR_POD_LABELS = {
    "app.kubernetes.io/part-of": "pdwarden",
    "app.kubernetes.io/component": "operator",
}


def network_policy_name(deployment: str) -> str:
    return f"{deployment}-workers"


def _peer(peer: NetworkPeer) -> Obj:
    out: Obj = {}
    if peer.namespace_selector is not None:
        out["namespaceSelector"] = peer.namespace_selector.model_dump(
            mode="json", by_alias=True, exclude_defaults=True
        )
    if peer.pod_selector is not None:
        out["podSelector"] = peer.pod_selector.model_dump(
            mode="json", by_alias=True, exclude_defaults=True
        )
    return out


def _worker_port_only(peers: list[Obj]) -> Obj:
    return {"from": peers, "ports": [{"protocol": "TCP", "port": WORKER_PORT}]}


def worker_network_policy(
    owner: Owner, allow_from: Sequence[NetworkPeer] = (), operator_namespace: str | None = None
) -> Obj:
    """Ingress to the deployment's prefill and decode pods: its own pods, the operator (when its
    namespace is known: an operator running outside the cluster is not a pod) and `allow_from`."""
    ingress: list[Obj] = [
        # the router and the peer workers: worker, bootstrap and NIXL/UCX ports. A podSelector
        # without a namespaceSelector selects in the policy's own namespace only.
        {"from": [{"podSelector": {"matchLabels": {LABEL_DEPLOYMENT: owner.name}}}]},
    ]
    if operator_namespace:
        operator = {
            "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: operator_namespace}},
            "podSelector": {"matchLabels": dict(OPERATOR_POD_LABELS)},
        }
        ingress.append(_worker_port_only([operator]))
    if allow_from:
        ingress.append(_worker_port_only([_peer(p) for p in allow_from]))
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata(owner, network_policy_name(owner.name)),
        "spec": {
            "podSelector": {
                "matchLabels": {LABEL_DEPLOYMENT: owner.name},
                "matchExpressions": [
                    {"key": LABEL_ROLE, "operator": "In", "values": [ROLE_PREFILL, ROLE_DECODE]}
                ],
            },
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    }
