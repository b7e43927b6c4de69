"""The PDDeployment and PDRemediationPolicy API: pydantic models, the source of truth for the CRDs.

Why a package: the spec and status models, the cross-field rules they share with the API server
(as CEL), and the generator that turns them into the CRD belong together and stay pure (no
Kubernetes client, no kopf; import-linter enforces it), so every layer above can import them.
"""

from pdwarden.api.base import Rule
from pdwarden.api.crd import build_crd, build_policy_crd, render_crd_yaml, render_policy_crd_yaml
from pdwarden.api.network import NamespaceSelector, NetworkPeer, NetworkSpec
from pdwarden.api.parse import (
    InvalidSpec,
    parse_policy_spec,
    parse_policy_status,
    parse_spec,
    parse_status,
    spec_to_wire,
    status_to_wire,
    to_wire,
)
from pdwarden.api.policy import (
    CordonSpec,
    MetricsEndpoint,
    PDRemediationPolicySpec,
    PolicyRemediationSpec,
    SecretKeyRef,
    ServiceRef,
)
from pdwarden.api.policy_status import (
    POLICY_CONDITION_TYPES,
    HeldBack,
    PDRemediationPolicyStatus,
    PolicyCondition,
    PolicyConditionType,
    RefusedPod,
)
from pdwarden.api.pools import RouterSpec, WorkerPoolSpec
from pdwarden.api.remediation import ACTIONS, DEFAULT_ACTIONS, Action, Mode, RemediationSpec
from pdwarden.api.selector import LabelSelector, LabelSelectorRequirement
from pdwarden.api.spec import Engine, ModelSpec, PDDeploymentSpec, TransferSpec
from pdwarden.api.status import (
    CONDITION_TYPES,
    CanaryTally,
    Condition,
    ConditionType,
    CordonRecord,
    DecodeStatus,
    LedgerEntry,
    PDDeploymentStatus,
    RemediationStatus,
    RoleStatus,
    WedgeFinding,
)

__all__ = [
    "ACTIONS",
    "CONDITION_TYPES",
    "DEFAULT_ACTIONS",
    "POLICY_CONDITION_TYPES",
    "Action",
    "CanaryTally",
    "Condition",
    "ConditionType",
    "CordonRecord",
    "CordonSpec",
    "DecodeStatus",
    "Engine",
    "HeldBack",
    "InvalidSpec",
    "LabelSelector",
    "LabelSelectorRequirement",
    "LedgerEntry",
    "MetricsEndpoint",
    "Mode",
    "ModelSpec",
    "NamespaceSelector",
    "NetworkPeer",
    "NetworkSpec",
    "PDDeploymentSpec",
    "PDDeploymentStatus",
    "PDRemediationPolicySpec",
    "PDRemediationPolicyStatus",
    "PolicyCondition",
    "PolicyConditionType",
    "PolicyRemediationSpec",
    "RefusedPod",
    "RemediationSpec",
    "RemediationStatus",
    "RoleStatus",
    "RouterSpec",
    "Rule",
    "SecretKeyRef",
    "ServiceRef",
    "TransferSpec",
    "WedgeFinding",
    "WorkerPoolSpec",
    "build_crd",
    "build_policy_crd",
    "parse_policy_spec",
    "parse_policy_status",
    "parse_spec",
    "parse_status",
    "render_crd_yaml",
    "render_policy_crd_yaml",
    "spec_to_wire",
    "status_to_wire",
    "to_wire",
]
