"""Who besides a PDDeployment's own pods and the operator may reach its prefill and decode pods.

Why a field of its own: the workers' HTTP port serves `/generate` without authentication, so the
NetworkPolicy the operator renders (render/network_policy.py) admits only the deployment's own pods
and the operator. A gateway that talks to the workers directly (an inference gateway's endpoint
picker, a second router) has to be named here, explicitly and per deployment, with the same peer
shape a NetworkPolicy uses. Selectors are refused when empty: an empty one would admit a whole
namespace or the whole cluster by accident.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from pdwarden.api.base import ApiModel, Rule
from pdwarden.api.selector import (
    MAX_EXPRESSIONS,
    MAX_MATCH_LABELS,
    LabelSelector,
    LabelSelectorRequirement,
    LabelValue,
)

MAX_ALLOW_FROM = 16
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"  # set by the API server on every namespace


class NamespaceSelector(LabelSelector):
    """Which namespaces: all matchLabels and every matchExpressions requirement must hold.

    Every namespace carries the label kubernetes.io/metadata.name=<its name>, so one namespace is
    matchLabels: {kubernetes.io/metadata.name: <name>}. At least one of the two must be non-empty:
    an empty selector would match every namespace.
    """

    match_labels: dict[str, LabelValue] = Field(
        default_factory=dict,
        max_length=MAX_MATCH_LABELS,
        description="Labels the namespace must carry with exactly these values.",
    )
    match_expressions: list[LabelSelectorRequirement] = Field(
        default_factory=list,
        max_length=MAX_EXPRESSIONS,
        description="Requirements the namespace's labels must meet, all of them.",
    )

    RULES: ClassVar[tuple[Rule, ...]] = (
        Rule(
            cel=(
                "(has(self.matchLabels) && size(self.matchLabels) > 0) || "
                "(has(self.matchExpressions) && size(self.matchExpressions) > 0)"
            ),
            message=(
                "a namespaceSelector needs at least one matchLabels entry or matchExpressions "
                "requirement: an empty selector matches every namespace"
            ),
            field_path="",
            check=lambda s: bool(s.match_labels or s.match_expressions),
        ),
    )


class NetworkPeer(ApiModel):
    """Pods admitted to the prefill and decode pods' HTTP port, as in a NetworkPolicy.

    podSelector alone: those pods in the PDDeployment's own namespace. namespaceSelector alone:
    every pod in those namespaces. Both: the pods podSelector picks, in the namespaces
    namespaceSelector picks.
    """

    namespace_selector: NamespaceSelector | None = Field(
        None,
        description=(
            "Namespaces the admitted pods run in (kubernetes.io/metadata.name=<name> picks one); "
            "unset: the PDDeployment's own namespace."
        ),
    )
    pod_selector: LabelSelector | None = Field(
        None,
        description="Labels of the admitted pods; unset: every pod of the selected namespaces.",
    )

    RULES: ClassVar[tuple[Rule, ...]] = (
        Rule(
            cel="has(self.namespaceSelector) || has(self.podSelector)",
            message="an allowFrom entry needs a namespaceSelector, a podSelector or both",
            field_path="",
            check=lambda s: s.namespace_selector is not None or s.pod_selector is not None,
        ),
    )


class NetworkSpec(ApiModel):
    """Who may reach the prefill and decode pods besides the deployment's own pods and the
    operator.

    The operator renders a NetworkPolicy <name>-workers that admits to the prefill and decode
    pods only pods of this PDDeployment (its router and peer workers, every port) and the
    pdwarden operator's pods in the operator's namespace (the HTTP port only). `/generate` on
    that port is not authenticated: list here the gateways that must call the workers directly.
    The router is not covered: it is the deployment's front door. Enforced only by a network
    plugin that implements NetworkPolicy (Calico, Cilium, ...).
    """

    allow_from: list[NetworkPeer] = Field(
        default_factory=list,
        max_length=MAX_ALLOW_FROM,
        description=(
            "Extra peers admitted to the prefill and decode pods' HTTP port (serving, "
            "/metrics, the token-protected admin API); never to the bootstrap or KV transfer "
            "ports. Each entry is one NetworkPolicy peer."
        ),
    )
