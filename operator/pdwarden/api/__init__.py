"""The PDDeployment API: pydantic models that are the single source of truth for the CRD.

Why a package: the spec and status models, the cross-field rules they share with the API server
(as CEL), and the generator that turns them into the CRD belong together and stay pure (no
Kubernetes client, no kopf; import-linter enforces it), so every layer above can import them.
"""

from pdwarden.api.base import Rule
from pdwarden.api.crd import build_crd, render_crd_yaml
from pdwarden.api.parse import InvalidSpec, parse_spec, parse_status, spec_to_wire, status_to_wire
from pdwarden.api.pools import RouterSpec, WorkerPoolSpec
from pdwarden.api.remediation import ACTIONS, DEFAULT_ACTIONS, Action, Mode, RemediationSpec
from pdwarden.api.spec import Engine, ModelSpec, PDDeploymentSpec, TransferSpec
from pdwarden.api.status import (
    CONDITION_TYPES,
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
    "Action",
    "Condition",
    "ConditionType",
    "CordonRecord",
    "DecodeStatus",
    "Engine",
    "InvalidSpec",
    "LedgerEntry",
    "Mode",
    "ModelSpec",
    "PDDeploymentSpec",
    "PDDeploymentStatus",
    "RemediationSpec",
    "RemediationStatus",
    "RoleStatus",
    "RouterSpec",
    "Rule",
    "TransferSpec",
    "WedgeFinding",
    "WorkerPoolSpec",
    "build_crd",
    "parse_spec",
    "parse_status",
    "render_crd_yaml",
    "spec_to_wire",
    "status_to_wire",
]
