"""The observed state of a PDDeployment, as the operator writes it to the status subresource.

Why typed: a structural CRD prunes status fields it does not declare, so every field the operator
writes must be in the schema; and the remediation ledger must survive operator restarts, so it is
bounded here (MAX_HISTORY) and read back on every pass.
"""

from __future__ import annotations

from typing import Annotated, Literal, get_args

from pydantic import AwareDatetime, Field

from pdwarden.api.base import StatusModel

ConditionType = Literal[
    "Ready", "Progressing", "Degraded", "Wedged", "RemediationSuspended", "Advisories", "Screened"
]
CONDITION_TYPES: tuple[ConditionType, ...] = get_args(ConditionType)
LedgerAction = Literal[
    "FailRooms",
    "CordonDecode",
    "RestartDecode",
    "UncordonDecode",
    "AbortRequests",
    "RestartPrefill",
]
Phase = Literal["Pending", "Progressing", "Ready", "Degraded", "Wedged", "Failed"]
MAX_WEDGES = 32
MAX_HISTORY = 50
MAX_CORDONED = 64
MAX_MESSAGE = 1024  # ledger reasons, selectors, condition reasons
MAX_CONDITION_MESSAGE = 32768  # metav1.Condition's own limit
MAX_WEDGED_MESSAGE = 4000  # the Wedged condition lists findings; keep it readable
MAX_NAME = 253  # a pod name (DNS-1123 subdomain)


class Condition(StatusModel):
    """A metav1.Condition-shaped observation."""

    type: ConditionType = Field(
        description=(
            "Ready, Progressing, Degraded, Wedged, RemediationSuspended, Advisories or Screened "
            "(prometheus mode only)."
        )
    )
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(
        min_length=1,
        max_length=MAX_MESSAGE,
        pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$",
        description="CamelCase reason for the last transition.",
    )
    message: str = Field(
        "", max_length=MAX_CONDITION_MESSAGE, description="Human-readable details."
    )
    last_transition_time: AwareDatetime = Field(description="When status last changed.")
    observed_generation: int | None = Field(
        None, ge=0, description="metadata.generation this condition was computed from."
    )


class RoleStatus(StatusModel):
    """Replica counts of one role, as its workload reports them."""

    replicas: int = Field(0, ge=0, description="Pods the spec asks for.")
    ready_replicas: int = Field(0, ge=0, description="Pods that are ready (and not cordoned).")
    updated_replicas: int = Field(0, ge=0, description="Pods on the current template.")
    summary: str = Field("", max_length=32, description="ready/desired, as kubectl get shows it.")
    selector: str = Field("", max_length=MAX_MESSAGE, description="Label selector of the pods.")


class DecodeStatus(RoleStatus):
    """Replica counts of the decode pool, plus what remediation holds out of service."""

    cordoned_replicas: int = Field(0, ge=0, description="Decode pods cordoned by remediation.")


class WedgeFinding(StatusModel):
    """A current wedge: rooms stuck in a worker's queue past spec.remediation.wedgeAfterSeconds."""

    pod: str = Field(max_length=MAX_NAME, description="Worker pod whose queue holds the rooms.")
    role: Literal["prefill", "decode"] = Field(description="Role of that pod.")
    reason: str = Field(max_length=64, description="Detection rule that fired, e.g. InflightStuck.")
    rooms: int = Field(0, ge=0, description="Number of wedged rooms.")
    oldest_seconds: float = Field(0, ge=0, description="Age in the queue of the oldest room.")
    peer: str | None = Field(None, max_length=MAX_NAME, description="Decode pod the rooms wait on.")
    since: AwareDatetime = Field(description="When the wedge was first seen.")


class CordonRecord(StatusModel):
    """A decode pod held out of service by remediation."""

    pod: str = Field(max_length=MAX_NAME, description="Cordoned decode pod.")
    since: AwareDatetime = Field(description="When it was cordoned.")


MAX_PENDING_ROOMS = 256  # room ids a pending FailRooms carries, so a standby can complete it
LedgerOutcome = Literal["Pending", "Succeeded", "Failed", "Skipped"]


class LedgerEntry(StatusModel):
    """One remediation action, taken or (in DryRun) only planned.

    An action is written here as Pending before it touches anything, and completed after; a
    Pending entry that outlives the replica that wrote it is completed by the next one, from
    what the pods show (docs/operations.md, "What a failover may lose").
    """

    id: str | None = Field(
        None,
        max_length=32,
        pattern=r"^[a-z0-9]+$",
        description="Identity of the entry: its Pending and completed forms share it.",
    )
    time: AwareDatetime = Field(description="When the action was decided.")
    action: LedgerAction = Field(description="What was done.")
    pod: str = Field(max_length=MAX_NAME, description="Pod acted on.")
    peer: str | None = Field(
        None,
        max_length=MAX_NAME,
        description="FailRooms: the decode pod the failed rooms waited on.",
    )
    rooms: int = Field(
        0,
        ge=0,
        description=(
            "FailRooms: rooms failed. AbortRequests: requests the prefill pod held (running, "
            "waiting, bootstrap and inflight queues) just before all of them were aborted."
        ),
    )
    reason: str = Field("", max_length=MAX_MESSAGE, description="Why, in a sentence.")
    dry_run: bool = Field(False, description="True if the action was only recorded (DryRun).")
    outcome: LedgerOutcome = Field(
        "Succeeded",
        description=(
            "What happened when the action was applied; Pending while it is being applied."
        ),
    )
    uid: str | None = Field(
        None, max_length=64, description="The pod incarnation (metadata.uid) acted on."
    )
    room_ids: list[Annotated[int, Field(ge=0)]] | None = Field(
        None,
        max_length=MAX_PENDING_ROOMS,
        description="A Pending FailRooms: the room ids it fails (dropped once completed).",
    )


class CanaryTally(StatusModel):
    """What pdwarden's canaries cost this object's pods, summed over its cycles since `since`.
    Brought up to date with any other status change, and by the canaries alone at most every
    5 minutes (no status write per canary); a cycle whose status write was lost is not counted
    (Prometheus has the exact counts, at once: pdwarden_canary_requests_total,
    pdwarden_canary_wait_seconds_total)."""

    sent: int = Field(0, ge=0, description="Canaries sent: pair canaries and one-token canaries.")
    requests: int = Field(
        0,
        ge=0,
        description=(
            "Requests they made to worker pods: one per pair canary leg sent; two per one-token "
            "canary (its model list and its completion)."
        ),
    )
    seconds: float = Field(0, ge=0, description="Seconds the cycles waited on their answers.")
    since: AwareDatetime | None = Field(None, description="When counting began.")
    last: AwareDatetime | None = Field(
        None, description="When the tally was last brought up to date (at most 5 minutes old)."
    )


class RemediationStatus(StatusModel):
    """The remediation ledger: bounded, durable memory of what was done and what is held."""

    history: list[LedgerEntry] = Field(
        default_factory=list,
        max_length=MAX_HISTORY,
        description=f"The last {MAX_HISTORY} actions, oldest first.",
    )
    cordoned: list[CordonRecord] = Field(
        default_factory=list, max_length=MAX_CORDONED, description="Decode pods cordoned now."
    )
    actions_last_hour: int = Field(0, ge=0, description="Actions counted by the circuit breaker.")
    suspended: bool = Field(False, description="True while the circuit breaker is open.")
    breaker_reset_at: AwareDatetime | None = Field(
        None, description="When the breaker was last reset; earlier actions no longer count."
    )
    decode_budget: int = Field(0, ge=0, description="Decode pods remediation may hold now.")
    canaries: CanaryTally | None = Field(
        None, description="What the canaries pdwarden sent through the pods cost them."
    )


class PDDeploymentStatus(StatusModel):
    """What pdwarden last observed and did."""

    observed_generation: int | None = Field(
        None, ge=0, description="metadata.generation the status was computed from."
    )
    phase: Phase | None = Field(None, description="One-word summary for kubectl get.")
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=len(CONDITION_TYPES),
        description=(
            "Ready, Progressing, Degraded, Wedged, RemediationSuspended, Advisories (pod settings "
            "that switch an engine's own safety nets off: warnings only)."
        ),
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    prefill: RoleStatus | None = Field(None, description="Prefill pool replicas.")
    decode: DecodeStatus | None = Field(None, description="Decode pool replicas.")
    router: RoleStatus | None = Field(None, description="Router replicas.")
    wedged_rooms: int = Field(0, ge=0, description="Rooms wedged now, over all findings.")
    wedges: list[WedgeFinding] = Field(
        default_factory=list, max_length=MAX_WEDGES, description="Current wedge findings."
    )
    remediation: RemediationStatus | None = Field(None, description="The remediation ledger.")
