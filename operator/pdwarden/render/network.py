"""The NetworkPolicy each PDDeployment gets for its prefill and decode pods.

Why a module of its own: who may reach a worker is a security boundary, not a detail of the pod
template. Worker pods serve the admin API (bearer token), /metrics and serving on the worker port
and the KV bootstrap server on the bootstrap port; NIXL/UCX between prefill and decode uses ports
chosen at run time. So the policy admits, on every port, only pods carrying this deployment's own
`pdwarden.dev/deployment` value (its router and its peer workers), and, on the worker port only,
the pdwarden operator (scrapes /metrics, fails rooms). A pod of another deployment, or any pod
that merely has the label key, is not admitted. The router is left unselected: it is the front
door. Policies are additive: a user lets Prometheus in with one more NetworkPolicy (the chart's
`networkPolicy.extraFrom`); see SECURITY.md.
"""

from __future__ import annotations

from pdwarden.constants import LABEL_DEPLOYMENT, LABEL_ROLE, ROLE_DECODE, ROLE_PREFILL
from pdwarden.render.common import WORKER_PORT, Obj, Owner, metadata

# The labels every operator pod of the Helm chart carries (helm/pdwarden/templates/_helpers.tpl,
# pdwarden.selectorLabels + pdwarden.labels); the operator may run in any namespace.
OPERATOR_POD_LABELS = {
    "app.kubernetes.io/part-of": "pdwarden",
    "app.kubernetes.io/component": "operator",
}


def network_policy_name(deployment: str) -> str:
    return f"{deployment}-workers"


def worker_network_policy(owner: Owner) -> Obj:
    """Ingress to the deployment's prefill and decode pods: its own pods, and the operator."""
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
            "ingress": [
                # the router and the peer workers: worker, bootstrap and NIXL/UCX ports
                {"from": [{"podSelector": {"matchLabels": {LABEL_DEPLOYMENT: owner.name}}}]},
                # the operator, from whichever namespace it runs in: the worker port only
                {
                    "from": [
                        {
                            "namespaceSelector": {},
                            "podSelector": {"matchLabels": dict(OPERATOR_POD_LABELS)},
                        }
                    ],
                    "ports": [{"protocol": "TCP", "port": WORKER_PORT}],
                },
            ],
        },
    }
