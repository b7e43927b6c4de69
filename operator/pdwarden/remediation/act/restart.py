"""RestartDecode and RestartPrefill: a pod deleted (ours) or evicted (a policy's), one incarnation.

Why two ways: a PDDeployment's StatefulSet recreates a deleted pod, and pdwarden is the pod's
owner, so it deletes with a uid precondition (a pod already replaced is left alone). A
PDRemediationPolicy's pods belong to someone else, so it goes through the Eviction API, where
PodDisruptionBudgets decide: a 429 holds the restart back (Skipped, with the API server's reason
in the policy's status), which the circuit breaker does not count; the pod is read again right
before, because the API server charges the PDB before it checks the uid precondition.
"""

from __future__ import annotations

from datetime import datetime
from typing import Final

from pdwarden.api import HeldBack
from pdwarden.api.status import MAX_MESSAGE
from pdwarden.ports import ForeignPodApi, KubeApi
from pdwarden.remediation.act.done import Done, Outcome, skipped
from pdwarden.remediation.decide import PlannedAction
from pdwarden.remediation.policy.scope import foreign_pod
from pdwarden.values import EvictionOutcome, EvictionResult

_LEDGER: Final[dict[EvictionResult, Outcome]] = {
    "Evicted": "Succeeded",
    "HeldBack": "Skipped",
    "Gone": "Skipped",
    "Failed": "Failed",
}


async def delete(client: KubeApi, namespace: str, action: PlannedAction) -> Done:
    if await client.delete_pod(namespace, action.pod, action.uid):
        return Done()
    return skipped("the pod was already gone or replaced")


def eviction_done(action: PlannedAction, outcome: EvictionOutcome, now: datetime) -> Done:
    """A restart done by eviction, as the ledger records it: held back and gone are Skipped
    (the breaker does not count them, so a PDB that blocks every eviction cannot trip it)."""
    detail = outcome.reason if outcome.result != "Gone" else f"skipped: {outcome.reason}"
    held = (
        HeldBack(time=now, action=action.kind, pod=action.pod, reason=outcome.reason[:MAX_MESSAGE])
        if outcome.result == "HeldBack"
        else None
    )
    return Done(_LEDGER[outcome.result], detail, held=held)


async def evict(
    client: KubeApi, foreign: ForeignPodApi, namespace: str, action: PlannedAction, now: datetime
) -> Done:
    fresh = await client.get("v1", "Pod", namespace, action.pod)
    pod = foreign_pod(fresh) if fresh is not None else None
    if pod is None or (action.uid and pod.uid != action.uid):
        return skipped("the pod was already gone or replaced")
    if pod.owned_by_pdwarden or pod.terminating:
        return skipped("the pod is terminating or now belongs to a PDDeployment")
    return eviction_done(action, await foreign.evict_pod(namespace, action.pod, pod.uid), now)
