"""The verbs a PDRemediationPolicy uses on pods pdwarden does not own: label cordon and eviction.

Why a module of its own: pods of a PDDeployment are pdwarden's (readiness gate, delete); foreign
pods belong to LeaderWorkerSet, a StatefulSet or another controller, so pdwarden touches them only
in two ways that their owners tolerate: one label, merge-patched with the incarnation guarded
(uid and resourceVersion), and the Eviction API (policy/v1) with a uid precondition, which honours
PodDisruptionBudgets. Each call has its own deadline and comes back as an outcome the remediation
loop can record (patched, conflict, gone; evicted, held back, gone), or a ForeignActionError that
names the pod and the verb. Which label to set is decided in remediation.act.pod_label; how the
Eviction API's answer reads (`eviction_outcome`) is decided here, next to the call.
"""

from __future__ import annotations

import dataclasses
from typing import Final, Literal

from urllib3.exceptions import HTTPError

from pdwarden.api.status import MAX_MESSAGE
from pdwarden.k8s.client import ApiError, KubeClient, Obj, resource_path
from pdwarden.values import EvictionOutcome, LabelPatch

ACTION_TIMEOUT: Final = 10.0
LabelResult = Literal["Patched", "Conflict", "Gone"]


class ForeignActionError(Exception):
    """A label patch or eviction failed for a reason other than the expected refusals."""

    def __init__(self, verb: str, namespace: str, pod: str, error: ApiError) -> None:
        super().__init__(f"{verb} pod {namespace}/{pod}: {error}")
        self.status = error.status
        self.transient = error.transient


async def _request(
    client: KubeClient,
    deadline: float,
    method: str,
    path: str,
    body: Obj | None,
    *,
    content_type: str = "application/json",
    retry_throttled: bool = True,
) -> Obj:
    """One call with its own deadline (the request timeout; +2 s for the worker thread).

    urllib3 gives up with its own exceptions (MaxRetryError wrapping a refused connection or a
    read timeout), which KubeClient does not translate; they become ApiError(0) here so that a
    down or hung API server is a transient error like any other transport failure.
    """
    bounded = client.within(deadline)
    try:
        return await bounded._call(
            method, path, body=body, content_type=content_type, retry_throttled=retry_throttled
        )
    except HTTPError as e:
        raise ApiError(0, f"{method} {path}: {type(e).__name__}: {e}") from None


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


async def set_pod_label(
    client: KubeClient, namespace: str, patch: LabelPatch, *, deadline: float = ACTION_TIMEOUT
) -> LabelResult:
    """Set one label on the pod incarnation `patch` names (JSON merge patch).

    The patch carries the pod's uid and, when known, the resourceVersion the plan saw: the API
    server applies it only to that incarnation in that state (a stale resourceVersion is a 409;
    a different uid is a 422 "metadata.uid: field is immutable", checked in
    tests/operator/test_foreign_cluster.py). Conflict: the pod changed since (re-read and
    re-plan); Gone: it no longer exists.
    """
    metadata: Obj = {"labels": {patch.key: patch.value}, "uid": patch.uid}
    if patch.resource_version:
        metadata["resourceVersion"] = patch.resource_version
    try:
        await _request(
            client,
            deadline,
            "PATCH",
            resource_path("v1", "Pod", namespace, patch.pod),
            {"metadata": metadata},
            content_type="application/merge-patch+json",
        )
    except ApiError as e:
        if e.status == 404:
            return "Gone"
        if e.status == 409:
            return "Conflict"  # resourceVersion moved on
        if e.status == 422 and "metadata.uid" in e.reason:
            return "Conflict"  # another incarnation: its uid differs from ours ("immutable")
        verb = f"label {patch.key}={patch.value} on"
        raise ForeignActionError(verb, namespace, patch.pod, e) from None
    return "Patched"


async def evict_pod(
    client: KubeClient, namespace: str, name: str, uid: str, *, deadline: float = ACTION_TIMEOUT
) -> EvictionOutcome:
    """Ask the Eviction API to evict the incarnation `uid` of pod `name`.

    PodDisruptionBudgets decide: a refusal (429) comes back as HeldBack with the API server's
    reason, not as an error. Transport errors and other statuses raise ForeignActionError,
    except those eviction_outcome classifies (404/409 Gone, the multiple-PDB 500 HeldBack).
    """
    body = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": name, "namespace": namespace},
        "deleteOptions": {"preconditions": {"uid": uid}},
    }
    try:
        await _request(  # its 429 is the disruption budget's answer: returned, not retried
            client, deadline, "POST", resource_path("v1", "Pod", namespace, name, "eviction"),
            body, retry_throttled=False,
        )  # fmt: skip
    except ApiError as e:
        outcome = eviction_outcome(e.status, e.reason)
        if outcome.result == "Failed":
            raise ForeignActionError("evict", namespace, name, e) from None
        return outcome
    return eviction_outcome(201, "")


async def service_selector(
    client: KubeClient, namespace: str, name: str, *, deadline: float = ACTION_TIMEOUT
) -> dict[str, str] | None:
    """The selector of Service `name` ({} when it has none), or None when it does not exist."""
    try:
        service = await _request(
            client, deadline, "GET", resource_path("v1", "Service", namespace, name), None
        )
    except ApiError as e:
        if e.status == 404:
            return None
        raise
    selector = (service.get("spec") or {}).get("selector") or {}
    return {str(k): str(v) for k, v in selector.items()}


@dataclasses.dataclass(frozen=True)
class ForeignPods:
    """The three verbs above bound to one client (satisfies pdwarden.ports.ForeignPodApi)."""

    client: KubeClient

    async def set_pod_label(self, namespace: str, patch: LabelPatch) -> str:
        return await set_pod_label(self.client, namespace, patch)

    async def evict_pod(self, namespace: str, name: str, uid: str) -> EvictionOutcome:
        return await evict_pod(self.client, namespace, name, uid)

    async def service_selector(self, namespace: str, name: str) -> dict[str, str] | None:
        return await service_selector(self.client, namespace, name)
