"""How a PDRemediationPolicy's actions land on pods it does not own: label cordon and eviction.

Why pure and separate: the remediation plan (remediation.plan) is shared with PDDeployment and
speaks of CordonDecode, UncordonDecode and RestartDecode. For foreign pods these become a label
patch and an Eviction, and each has a precondition pdwarden must check first and an outcome it
must read right:

* Cordon by label works only if the Service in front of the decode pods selects the label's
  serving value. Kubernetes Service selectors are equality-only, so the Service includes
  `<labelKey>: <servingValue>`; a cordon sets the label to cordonedValue (the pod leaves the
  endpoints) and an uncordon sets it back to servingValue (never removes it: a pod without the
  label is not selected either). `cordon_check` refuses while the selector is not in place.
* Restart is an eviction (policy/v1), so PodDisruptionBudgets are honoured. A 429 from the
  Eviction API is the PDB saying "not now": the action is held back with the API server's
  reason, recorded as Skipped in the ledger, not counted as a failure or by the breaker.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from pdwarden.api import CordonSpec, HeldBack, LedgerEntry
from pdwarden.api.status import MAX_MESSAGE
from pdwarden.ledger import ledger_entry
from pdwarden.policy_scope import ForeignPod
from pdwarden.remediation import Action


@dataclass(frozen=True)
class CordonCheck:
    """The CordonUnavailable condition: `unavailable` True blocks cordons, None = cannot tell."""

    unavailable: bool | None
    reason: str
    message: str

    @property
    def allows_cordon(self) -> bool:
        """Cordon unless the Service is known not to honour the label."""
        return self.unavailable is not True


def cordon_check(
    cordon: CordonSpec,
    service_selector: Mapping[str, str] | None,
    decode_pods: tuple[ForeignPod, ...] = (),
) -> CordonCheck:
    """Whether the label cordon would take a decode pod out of service.

    `service_selector` is the selector of the Service named in cordon.serviceRef, or None when
    that Service does not exist (or no serviceRef is set).
    """
    want = f'{cordon.label_key}: "{cordon.serving_value}"'
    if cordon.service_ref is None:
        return CordonCheck(
            None,
            "NoServiceToCheck",
            f"spec.cordon.serviceRef is not set, so pdwarden cannot check that traffic to decode "
            f"pods selects {want}; cordons set the label but may not take pods out of service",
        )
    service = cordon.service_ref.name
    if service_selector is None:
        return CordonCheck(
            True,
            "ServiceNotFound",
            f"Service {service} (spec.cordon.serviceRef) does not exist; not cordoning",
        )
    value = service_selector.get(cordon.label_key)
    if value is None:
        return CordonCheck(
            True,
            "SelectorMissingLabel",
            f"Service {service}'s selector does not include {want}, so a cordon would not take "
            f"a pod out of service; add it to the selector and to the decode pod template",
        )
    if value != cordon.serving_value:
        return CordonCheck(
            True,
            "SelectorValueMismatch",
            f'Service {service} selects {cordon.label_key}: "{value}", not {want}',
        )
    unlabelled = sorted(
        p.name
        for p in decode_pods
        if p.labels.get(cordon.label_key) not in (cordon.serving_value, cordon.cordoned_value)
    )
    message = f"Service {service} selects {want}"
    if unlabelled:
        message += (
            f"; {len(unlabelled)} decode pod(s) lack the label and get no traffic from it "
            f"({', '.join(unlabelled[:8])}): add it to the decode pod template"
        )
    return CordonCheck(False, "SelectorIncludesLabel", message)


@dataclass(frozen=True)
class LabelPatch:
    """Set one label on one pod incarnation (guarded by uid and resourceVersion)."""

    pod: str
    uid: str
    resource_version: str
    key: str
    value: str


def label_patch(action: Action, pod: ForeignPod, cordon: CordonSpec) -> LabelPatch | None:
    """The label change a CordonDecode/UncordonDecode means for `pod`; None if already so.

    Other actions have no label change. The patch is for the incarnation the plan saw: a pod
    re-created since (another uid) is not touched.
    """
    if action.kind == "CordonDecode":
        value = cordon.cordoned_value
    elif action.kind == "UncordonDecode":
        value = cordon.serving_value
    else:
        return None
    if action.uid and action.uid != pod.uid:
        return None
    if pod.labels.get(cordon.label_key) == value:
        return None
    return LabelPatch(pod.name, pod.uid, pod.resource_version, cordon.label_key, value)


EvictionResult = Literal["Evicted", "HeldBack", "Gone", "Failed"]


@dataclass(frozen=True)
class EvictionOutcome:
    result: EvictionResult
    reason: str


def eviction_outcome(status: int, message: str) -> EvictionOutcome:
    """Read the Eviction API's answer (policy/v1, pods/eviction create).

    201/200: evicted. 429: a PodDisruptionBudget forbids it now (held back). 404: the pod is
    gone; 409: the uid precondition failed, a new incarnation stands there: either way nothing
    to do. 500 with "more than one PodDisruptionBudget": the API server refuses to pick one, a
    configuration the user must fix; held back, not retried as a failure. Anything else failed.
    """
    text = message.strip()[:MAX_MESSAGE] or f"HTTP {status}"
    if 200 <= status < 300:
        return EvictionOutcome("Evicted", "")
    if status == 429:
        return EvictionOutcome("HeldBack", f"PodDisruptionBudget: {text}")
    if status in (404, 409):
        return EvictionOutcome("Gone", text)
    if status == 500 and "more than one" in text.lower() and "disruption" in text.lower():
        return EvictionOutcome("HeldBack", f"PodDisruptionBudget: {text}")
    return EvictionOutcome("Failed", text)


_LEDGER_OUTCOME: dict[EvictionResult, Literal["Succeeded", "Failed", "Skipped"]] = {
    "Evicted": "Succeeded",
    "HeldBack": "Skipped",
    "Gone": "Skipped",
    "Failed": "Failed",
}


def record_eviction(
    action: Action, outcome: EvictionOutcome, now: datetime
) -> tuple[LedgerEntry, HeldBack | None]:
    """The ledger entry for a restart (RestartDecode, RestartPrefill) done by eviction, and a
    held-back note if any.

    Held back and gone are Skipped: the circuit breaker does not count them (see
    remediation.actions_in_last_hour), so a PDB that blocks every eviction cannot trip it.
    """
    detail = outcome.reason if outcome.result != "Gone" else f"skipped: {outcome.reason}"
    entry = ledger_entry(
        action, now=now, dry_run=False, outcome=_LEDGER_OUTCOME[outcome.result], detail=detail
    )
    held = (
        HeldBack(time=now, action=action.kind, pod=action.pod, reason=outcome.reason[:MAX_MESSAGE])
        if outcome.result == "HeldBack"
        else None
    )
    return entry, held
