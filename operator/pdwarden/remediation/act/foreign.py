"""How a PDRemediationPolicy's actions land on pods it does not own: label cordon and eviction.

Why pure and separate: the remediation plan (remediation.plan) is shared with PDDeployment and
speaks of CordonDecode, UncordonDecode and RestartDecode. For foreign pods these become a label
patch and an Eviction, and each has a precondition pdwarden must check first and an outcome it
must read right:

* Cordon by label works only if the Service in front of the decode pods selects the label's
  serving value. Kubernetes Service selectors are equality-only, so the Service includes
  `<labelKey>: <servingValue>`; a cordon sets the label to cordonedValue (the pod leaves the
  endpoints) and an uncordon sets it back to servingValue (never removes it: a pod without the
  label is not selected either). `remediation.policy.cordon.cordon_check` refuses while the
  selector is not in place.
* Restart is an eviction (policy/v1), so PodDisruptionBudgets are honoured. A 429 from the
  Eviction API is the PDB saying "not now": the action is held back with the API server's
  reason, recorded as Skipped in the ledger, not counted as a failure or by the breaker.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from pdwarden.api import CordonSpec, HeldBack, LedgerEntry
from pdwarden.api.status import MAX_MESSAGE
from pdwarden.remediation.policy.plan import Action
from pdwarden.remediation.policy.scope import ForeignPod
from pdwarden.remediation.record.ledger import ledger_entry


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
