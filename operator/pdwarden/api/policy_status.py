"""The observed state of a PDRemediationPolicy, as the operator writes it to the status subresource.

Why a module of its own: a policy reports what a PDDeployment reports (conditions, current wedges,
the remediation ledger; the same models, reused) plus what only a policy can get wrong: pods it
matched but refuses to act on (owned by a PDDeployment, selected by another policy, selected as
both roles), and actions held back by something outside pdwarden (a PodDisruptionBudget).
Everything is bounded, like PDDeploymentStatus, because it is read back on every pass.
"""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import AwareDatetime, Field

from pdwarden.api.base import StatusModel
from pdwarden.api.status import (
    MAX_MESSAGE,
    MAX_WEDGES,
    Condition,
    LedgerAction,
    RemediationStatus,
    WedgeFinding,
)

PolicyConditionType = Literal[
    "Ready",
    "Progressing",
    "Degraded",
    "Wedged",
    "RemediationSuspended",
    "Advisories",
    "Screened",
    "Conflict",
    "CordonUnavailable",
]
POLICY_CONDITION_TYPES: tuple[PolicyConditionType, ...] = get_args(PolicyConditionType)
RefusalReason = Literal["OwnedByPDDeployment", "SelectedByAnotherPolicy", "BothRoles"]
MAX_REFUSED = 64
MAX_HELD_BACK = 32
MAX_OTHER_POLICIES = 8


class PolicyCondition(Condition):
    """A metav1.Condition-shaped observation; a policy has two condition types more.

    Conflict: another policy selects some of the same pods (none of them is acted on).
    CordonUnavailable: the label cordon would not take a pod out of service (the Service named in
    spec.cordon.serviceRef does not select the serving label, or is missing, or is not named).
    """

    # Wider than Condition.type on purpose: a policy has the PDDeployment's six types and two of
    # its own; every other field is Condition's.
    type: PolicyConditionType = Field(  # type: ignore[assignment]
        description=(
            "Ready, Progressing, Degraded, Wedged, RemediationSuspended, Advisories, Conflict or "
            "CordonUnavailable."
        )
    )


class PolicyRoleStatus(StatusModel):
    """The pods one of the policy's selectors matches, and how many pdwarden may act on."""

    matched: int = Field(0, ge=0, description="Pods the selector matches.")
    eligible: int = Field(
        0, ge=0, description="Matched pods pdwarden may act on (not refused, see refused)."
    )
    ready: int = Field(0, ge=0, description="Matched pods that are Ready.")
    selector: str = Field("", max_length=MAX_MESSAGE, description="The selector, as a query.")


class PolicyDecodeStatus(PolicyRoleStatus):
    """Decode pods, plus what remediation holds out of service."""

    cordoned: int = Field(0, ge=0, description="Decode pods cordoned by the policy's label now.")


class RefusedPod(StatusModel):
    """A matched pod the policy will not act on, and why."""

    pod: str = Field(max_length=253, description="The pod.")
    reason: RefusalReason = Field(
        description="OwnedByPDDeployment, SelectedByAnotherPolicy or BothRoles."
    )
    policies: list[str] = Field(
        default_factory=list,
        max_length=MAX_OTHER_POLICIES,
        description="SelectedByAnotherPolicy: the other policies that select the pod.",
    )


class HeldBack(StatusModel):
    """An action the plan wanted that something outside pdwarden refused, for now."""

    time: AwareDatetime = Field(description="When it was last held back.")
    action: LedgerAction = Field(description="The action.")
    pod: str = Field(max_length=253, description="Pod it was for.")
    reason: str = Field(
        max_length=MAX_MESSAGE,
        description="Why, e.g. the PodDisruptionBudget that refused the eviction.",
    )


class PDRemediationPolicyStatus(StatusModel):
    """What pdwarden last observed and did for the selected pods."""

    observed_generation: int | None = Field(
        None, ge=0, description="metadata.generation the status was computed from."
    )
    conditions: list[PolicyCondition] = Field(
        default_factory=list,
        max_length=len(POLICY_CONDITION_TYPES),
        description=", ".join(POLICY_CONDITION_TYPES) + ".",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    prefill: PolicyRoleStatus | None = Field(None, description="Prefill pods.")
    decode: PolicyDecodeStatus | None = Field(None, description="Decode pods.")
    refused: list[RefusedPod] = Field(
        default_factory=list,
        max_length=MAX_REFUSED,
        description="Matched pods the policy does not act on, and why.",
    )
    held_back: list[HeldBack] = Field(
        default_factory=list,
        max_length=MAX_HELD_BACK,
        description="Actions held back by something outside pdwarden, e.g. a PDB.",
    )
    wedged_rooms: int = Field(0, ge=0, description="Rooms wedged now, over all findings.")
    wedges: list[WedgeFinding] = Field(
        default_factory=list, max_length=MAX_WEDGES, description="Current wedge findings."
    )
    remediation: RemediationStatus | None = Field(None, description="The remediation ledger.")
