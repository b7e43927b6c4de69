"""Which pods a PDRemediationPolicy may act on, and how many decode pods it may take out.

Why pure and separate: a policy acts on pods that belong to someone else, chosen by label
selectors a person typed. Before anything is scraped or touched, this module decides, from plain
data, which of the matched pods are the policy's to act on:

* never a pod that belongs to a PDDeployment (pdwarden's own labels or an owner reference in
  pdwarden's API group): that pod has its own remediation, with a readiness-gate cordon;
* never a pod that both of the policy's selectors match (it cannot be prefill and decode);
* never a pod that another policy (not Off) in the namespace also selects. Both policies refuse
  it and each names the other, whatever their age, names or the order they are listed in: the
  outcome depends only on the set of policies, so it cannot flip when one is re-created, and
  neither owner is silently overruled. The fix is a selector edit, which the condition asks for.

The decode budget (maxUnavailableDecode) is counted over every pod the decode selector matches,
refused or not: a refused pod still serves (or fails to serve) the same traffic.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pdwarden.api import CordonSpec, PDRemediationPolicySpec, RefusedPod
from pdwarden.api.policy_status import MAX_OTHER_POLICIES, MAX_REFUSED, RefusalReason
from pdwarden.constants import GROUP, LABEL_DEPLOYMENT, LABEL_MANAGED_BY
from pdwarden.remediation.decide import PodState, decode_budget

MANAGED_BY_PDWARDEN = "pdwarden"


@dataclass(frozen=True)
class ForeignPod:
    """What the policy path needs of a pod, read once from the API object."""

    name: str
    uid: str
    resource_version: str
    labels: Mapping[str, str]
    ready: bool
    terminating: bool
    owned_by_pdwarden: bool
    ip: str | None = None


def foreign_pod(obj: Mapping[str, Any]) -> ForeignPod:
    """A pod as the API server returns it -> ForeignPod (missing fields read as absent)."""
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
    owners = meta.get("ownerReferences") or []
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    return ForeignPod(
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        resource_version=str(meta.get("resourceVersion", "")),
        labels=labels,
        ready=ready,
        terminating=meta.get("deletionTimestamp") is not None,
        owned_by_pdwarden=(
            LABEL_DEPLOYMENT in labels
            or labels.get(LABEL_MANAGED_BY) == MANAGED_BY_PDWARDEN
            or any(str(o.get("apiVersion", "")).startswith(f"{GROUP}/") for o in owners)
        ),
        ip=status.get("podIP"),
    )


@dataclass(frozen=True)
class Scope:
    """The result of selection: matched pods per role, the eligible ones, and the refusals."""

    prefill_matched: tuple[ForeignPod, ...] = ()
    decode_matched: tuple[ForeignPod, ...] = ()
    prefill: tuple[ForeignPod, ...] = ()  # eligible: the policy may scrape and act on these
    decode: tuple[ForeignPod, ...] = ()
    refused: tuple[RefusedPod, ...] = ()
    # Other policies that select some of the same pods, for the Conflict condition.
    conflicting_policies: tuple[str, ...] = field(default_factory=tuple)

    @property
    def refused_names(self) -> frozenset[str]:
        return frozenset(r.pod for r in self.refused)


def _selects(spec: PDRemediationPolicySpec, labels: Mapping[str, str]) -> bool:
    return spec.prefill_selector.matches(labels) or spec.decode_selector.matches(labels)


def select(
    name: str,
    spec: PDRemediationPolicySpec,
    policies: Mapping[str, PDRemediationPolicySpec],
    pods: Sequence[ForeignPod],
) -> Scope:
    """Decide which pods policy `name` may act on; `policies` is every policy in the namespace.

    `policies` may include `name` itself (it is skipped). Policies in mode Off do not conflict:
    they neither scrape nor act, so they hold no claim on a pod.
    """
    others = {n: s for n, s in policies.items() if n != name and s.remediation.mode != "Off"}
    prefill_matched: list[ForeignPod] = []
    decode_matched: list[ForeignPod] = []
    prefill: list[ForeignPod] = []
    decode: list[ForeignPod] = []
    refused: list[RefusedPod] = []
    conflicting: set[str] = set()
    for pod in sorted(pods, key=lambda p: p.name):
        is_prefill = spec.prefill_selector.matches(pod.labels)
        is_decode = spec.decode_selector.matches(pod.labels)
        if not (is_prefill or is_decode):
            continue
        if is_prefill:
            prefill_matched.append(pod)
        if is_decode:
            decode_matched.append(pod)
        reason: RefusalReason | None = None
        rivals: list[str] = []
        if pod.owned_by_pdwarden:
            reason = "OwnedByPDDeployment"
        elif is_prefill and is_decode:
            reason = "BothRoles"
        else:
            rivals = sorted(n for n, s in others.items() if _selects(s, pod.labels))
            if rivals:
                reason = "SelectedByAnotherPolicy"
                conflicting.update(rivals)
        if reason is not None:
            if len(refused) < MAX_REFUSED:
                refused.append(
                    RefusedPod(pod=pod.name, reason=reason, policies=rivals[:MAX_OTHER_POLICIES])
                )
            continue
        (prefill if is_prefill else decode).append(pod)
    return Scope(
        prefill_matched=tuple(prefill_matched),
        decode_matched=tuple(decode_matched),
        prefill=tuple(prefill),
        decode=tuple(decode),
        refused=tuple(refused),
        conflicting_policies=tuple(sorted(conflicting)),
    )


def is_cordoned(pod: ForeignPod, cordon: CordonSpec) -> bool:
    """Whether the pod carries the cordon label's cordoned value (whoever set it)."""
    return pod.labels.get(cordon.label_key) == cordon.cordoned_value


@dataclass(frozen=True)
class DecodeBudget:
    """maxUnavailableDecode over every matched decode pod, and what is already unavailable."""

    total: int
    matched: int
    unavailable: tuple[str, ...]

    @property
    def left(self) -> int:
        return max(0, self.total - len(self.unavailable))

    def allows(self, pod: str) -> bool:
        """Whether taking `pod` out (cordon or evict) stays within the budget.

        A pod already unavailable (cordoned, not ready, terminating) costs nothing more: evicting
        a cordoned pod does not take a second pod out of service.
        """
        return pod in self.unavailable or self.left > 0


def decode_budget_of(spec: PDRemediationPolicySpec, scope: Scope) -> DecodeBudget:
    matched = scope.decode_matched
    unavailable = tuple(
        p.name for p in matched if not p.ready or p.terminating or is_cordoned(p, spec.cordon)
    )
    return DecodeBudget(
        total=decode_budget(spec.remediation, len(matched)),
        matched=len(matched),
        unavailable=unavailable,
    )


def decode_pods_for_plan(
    spec: PDRemediationPolicySpec,
    scope: Scope,
    cordoned_since: Mapping[str, datetime],
    now: datetime,
) -> tuple[PodState, ...]:
    """The decode pods as `remediation.plan` sees them, for the policy's budget and decisions.

    Every matched decode pod is passed, so plan's budget counts the whole pool; refused pods are
    passed as stale, which plan counts toward the budget but never acts on. A pod with the
    cordoned label but no ledger record (cordoned before an operator restart lost it, or by a
    person) is treated as cordoned since `now`, so a restart waits a full restartAfterSeconds.
    """
    refused = scope.refused_names
    out = []
    for p in scope.decode_matched:
        since = cordoned_since.get(p.name, now) if is_cordoned(p, spec.cordon) else None
        out.append(
            PodState(
                name=p.name,
                uid=p.uid,
                ready=p.ready,
                cordoned_since=since,
                terminating=p.terminating,
                stale=p.name in refused,
            )
        )
    return tuple(out)


def conflict_message(scope: Scope) -> str:
    """For the Conflict condition: which pods, which other policies, and what to do."""
    clashing = [r for r in scope.refused if r.reason == "SelectedByAnotherPolicy"]
    if not clashing:
        return ""
    pods = ", ".join(r.pod for r in clashing[:8]) + (" ..." if len(clashing) > 8 else "")
    return (
        f"{len(clashing)} pod(s) ({pods}) are also selected by "
        f"{', '.join(scope.conflicting_policies)}; neither policy acts on them until the "
        "selectors no longer overlap"
    )
