"""How pdwarden repairs wedged KV transfers: the `spec.remediation` policy.

Why its own module: this is the part of the spec that can hurt a running service (it fails
requests, cordons and restarts decode pods), so its limits and cross-field rules live together and
are read by the remediation engine as one frozen object.
"""

from __future__ import annotations

import re
from typing import Annotated, ClassVar, Literal

from pydantic import Field, WithJsonSchema, field_validator

from pdwarden.api.base import ApiModel, Rule, nested
from pdwarden.constants import ANNOTATION_RESET_BREAKER

Mode = Literal["Enforce", "DryRun", "Off"]
Action = Literal["FailRooms", "CordonDecode", "RestartDecode", "AbortRequests", "RestartPrefill"]
ACTIONS: tuple[Action, ...] = (
    "FailRooms",
    "CordonDecode",
    "RestartDecode",
    "AbortRequests",
    "RestartPrefill",
)
# RestartPrefill is opt-in: it drops every request the prefill pod holds and its warm caches.
DEFAULT_ACTIONS: tuple[Action, ...] = (
    "FailRooms",
    "CordonDecode",
    "RestartDecode",
    "AbortRequests",
)
PERCENT_PATTERN = r"^[0-9]{1,2}%$"  # 0% .. 99%: a budget of 100% could empty the decode pool
_PERCENT = re.compile(PERCENT_PATTERN)
MAX_BUDGET_COUNT = 512

IntOrPercent = Annotated[
    int | str,
    # No `anyOf: [integer, string]` next to it: allowed, but kubectl explain ignores it anyway.
    WithJsonSchema({"x-kubernetes-int-or-string": True}),
]

_BUDGET = Rule(
    cel=(
        "type(self.maxUnavailableDecode) == string"
        f" ? self.maxUnavailableDecode.matches('{PERCENT_PATTERN}')"
        f" : (self.maxUnavailableDecode >= 0 && self.maxUnavailableDecode <= {MAX_BUDGET_COUNT})"
    ),
    message=(
        f"maxUnavailableDecode must be a count from 0 to {MAX_BUDGET_COUNT} or a percentage "
        "from 0% to 99%: a budget of 100% could take every decode pod out of service"
    ),
    field_path=".maxUnavailableDecode",
    check=lambda s: (
        bool(_PERCENT.match(s.max_unavailable_decode))
        if isinstance(s.max_unavailable_decode, str)
        else 0 <= s.max_unavailable_decode <= MAX_BUDGET_COUNT
    ),
)
_WEDGE_AFTER_SCRAPE = Rule(
    cel="self.wedgeAfterSeconds > self.scrapeIntervalSeconds",
    message=(
        "wedgeAfterSeconds must be greater than scrapeIntervalSeconds, "
        "or a wedge could be declared from a single scrape"
    ),
    field_path=".wedgeAfterSeconds",
    check=lambda s: s.wedge_after_seconds > s.scrape_interval_seconds,
)
_RESTART_AFTER_SCRAPE = Rule(
    cel="self.restartAfterSeconds >= self.scrapeIntervalSeconds",
    message=(
        "restartAfterSeconds must be at least scrapeIntervalSeconds, so a cordoned decode pod "
        "is scraped at least once before it is restarted"
    ),
    field_path=".restartAfterSeconds",
    check=lambda s: s.restart_after_seconds >= s.scrape_interval_seconds,
)
# On the engine's object (PDDeployment, PDRemediationPolicy), not here: it depends on the engine.
# SGLang restarts a prefill only after aborting its requests did not drain it; vLLM has no abort
# an operator can call (by request id only, under --enable-scale-out), so there RestartPrefill
# is the first and only rung (remediation/decide/rungs.py, restart_read_peer).
RESTART_PREFILL_NEEDS_ABORT = Rule(
    cel=(
        "self.engine == 'vllm' || !has(self.remediation) || "
        "!('RestartPrefill' in self.remediation.actions) || "
        "'AbortRequests' in self.remediation.actions"
    ),
    message=(
        "remediation.actions: RestartPrefill needs AbortRequests unless engine is vllm: a "
        "prefill pod whose queue is stuck is restarted only when aborting its requests did not "
        "drain it"
    ),
    field_path=".remediation.actions",
    check=lambda s: (
        s.engine == "vllm"
        or "RestartPrefill" not in s.remediation.actions
        or "AbortRequests" in s.remediation.actions
    ),
)
_RESTART_NEEDS_CORDON = Rule(
    cel="!('RestartDecode' in self.actions) || 'CordonDecode' in self.actions",
    message="RestartDecode needs CordonDecode in actions: only a cordoned pod is restarted",
    field_path=".actions",
    check=lambda s: "RestartDecode" not in s.actions or "CordonDecode" in s.actions,
)


class CanarySpec(ApiModel):
    """Pair canaries (engines that support them): for vllm, one request of one output token
    sent through a prefill and a decode the way the engine's own router sends it, so the KV
    really moves between them; for sglang, both sides' own /health at once (SGLang's two PD legs
    wait on each other, so only asking each side names the one that stopped). A pod whose own
    per-step counters stood still since its last scrape
    (canaries never count) is only a suspect until such a canary shows which side no longer
    answers; an idle pair gets one at most every quietSeconds, so a frozen engine is found
    without user traffic."""

    enabled: bool = Field(
        True, description="Send pair canaries (false: suspects wait for wedgeAfterSeconds)."
    )
    quiet_seconds: int = Field(
        10,
        ge=2,
        le=3600,
        description=(
            "Least seconds between two canaries through the same pod. A pod whose own progress "
            "counters did not move between two scrapes is asked at once unless it was asked "
            "this recently; an idle pod is asked this often."
        ),
    )
    deadline_seconds: int = Field(
        4,
        ge=1,
        le=120,
        description=(
            "Seconds each leg of a canary may take. A leg that gets no answer in time while the "
            "pod's own counters do not move either is a miss for that side, and the pair is "
            "asked again at once (failureThreshold misses in a row: dead); a slow but working "
            "engine moves its counters and is never called dead."
        ),
    )
    failure_threshold: int = Field(
        2,
        ge=1,
        le=10,
        description=(
            "Canaries in a row a side must leave unanswered (its counters still) before it is "
            "dead and acted on, like a probe's failureThreshold: one stall of a busy engine is "
            "not a death. Until then it is a suspect, asked again at once. Likewise (sglang) "
            "the KV requests in a row that must fail while both sides answer before a prefill "
            "whose transfers keep failing is restarted."
        ),
    )
    first_deadline_seconds: int = Field(
        30,
        ge=1,
        le=300,
        description=(
            "Seconds each leg of the first canary through a prefill/decode pair may take (the "
            "pair's KV handshake happens then: measured at more than 8 s on busy CPU pairs); "
            "once a canary through the pair decoded, deadlineSeconds applies. SGLang's canary "
            "(each side's own /health) makes no handshake: deadlineSeconds from the first."
        ),
    )


class RemediationSpec(ApiModel):
    """How pdwarden detects wedged KV transfers and what it may do about them.

    A room is wedged when it stays in a prefill worker's inflight queue (prefill finished, KV
    transfer not) longer than wedgeAfterSeconds. pdwarden then fails the wedged rooms on the
    prefill side (FailRooms), takes the decode pod they wait on out of service (CordonDecode), and
    restarts that pod if it still makes no progress restartAfterSeconds later (RestartDecode).

    Stock SGLang has no API to fail single rooms: there pdwarden aborts every request of the
    wedged prefill pod (AbortRequests, SGLang's POST /abort_request with abort_all) and, if its
    inflight queue still does not drain restartAfterSeconds later, restarts that prefill pod
    (RestartPrefill, opt-in).
    """

    mode: Mode = Field(
        "Enforce",
        description=(
            "Enforce acts; DryRun records what it would do (status, Events) without acting; "
            "Off neither scrapes nor acts."
        ),
    )
    scrape_interval_seconds: int = Field(
        5, ge=1, le=300, description="Seconds between two scrapes of every worker's /metrics."
    )
    wedge_after_seconds: int = Field(
        60,
        ge=2,
        le=86400,
        description=(
            "Seconds a room may spend in the prefill inflight queue, after its prefill finished, "
            "before it counts as wedged. Never time since the request arrived: long prefills are "
            "legal. Must be greater than scrapeIntervalSeconds."
        ),
    )
    actions: list[Action] = Field(
        list(DEFAULT_ACTIONS),
        max_length=len(ACTIONS),
        description=(
            "What remediation may do, a set of FailRooms (fail wedged rooms on prefill), "
            "CordonDecode (take the decode pod they wait on out of service: its readiness gate "
            "for a PDDeployment, the cordon label for a PDRemediationPolicy), RestartDecode "
            "(delete, for a policy evict, a cordoned decode pod that still makes no progress; "
            "needs CordonDecode), AbortRequests (sglang: abort every request of a wedged prefill "
            "pod, the only way stock SGLang frees wedged rooms) and RestartPrefill (opt-in; "
            "sglang: delete a prefill pod whose inflight queue still does not drain "
            "restartAfterSeconds after AbortRequests, or whose scheduler a pair canary found "
            "frozen, and needs AbortRequests; vllm: delete the prefill a decode's KV read is "
            "stuck on or a pair canary found dead)."
        ),
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    restart_after_seconds: int = Field(
        60,
        ge=1,
        le=86400,
        description=(
            "Seconds a cordoned decode pod may go without progress before RestartDecode deletes "
            "it, and seconds after AbortRequests before RestartPrefill deletes a prefill pod that "
            "is still wedged. At least scrapeIntervalSeconds."
        ),
    )
    max_unavailable_decode: IntOrPercent = Field(
        "25%",
        description=(
            "Budget of decode pods that remediation may hold cordoned or restarting at once: a "
            "count, or a percentage (0%-99%) rounded down of spec.decode.replicas (for a "
            "PDRemediationPolicy: of the pods decodeSelector matches). Remediation never takes "
            "the last ready decode pod out of service."
        ),
    )
    max_actions_per_hour: int = Field(
        20,
        ge=1,
        le=1000,
        description=(
            "Circuit breaker: after this many actions within one hour remediation stops acting "
            "and sets the condition RemediationSuspended until an operator resets it with the "
            f"annotation {ANNOTATION_RESET_BREAKER} or the hour passes."
        ),
    )
    cooldown_seconds: int = Field(
        60,
        ge=0,
        le=3600,
        description=(
            "Seconds after an action on a pod before remediation acts on that pod again, so the "
            "effect of the last action can be seen first."
        ),
    )

    canary: CanarySpec = nested(CanarySpec)

    RULES: ClassVar[tuple[Rule, ...]] = (
        _BUDGET,
        _WEDGE_AFTER_SCRAPE,
        _RESTART_AFTER_SCRAPE,
        _RESTART_NEEDS_CORDON,
    )

    @field_validator("actions")
    @classmethod
    def _no_duplicates(cls, actions: list[Action]) -> list[Action]:
        if len(set(actions)) != len(actions):
            raise ValueError("actions must not repeat an action")
        return actions

    @property
    def acts(self) -> bool:
        """Whether remediation changes anything (Enforce), rather than only reporting."""
        return self.mode == "Enforce"
