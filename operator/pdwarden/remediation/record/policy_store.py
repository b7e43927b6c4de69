"""Status writes of a PDRemediationPolicy: resourceVersion-guarded, the ledger merged on conflict.

Why a module of its own: the guarantee is status_store's (no writer erases another's ledger
entries; a stale cache never wins), for the policy's own status model. One writer per policy in
normal operation (its remediation daemon), two after an HA failover; on 409 the object is read
again and our status is re-applied on top of theirs with the ledger the union of both.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from pydantic import ValidationError

from pdwarden import metrics
from pdwarden.api import PDRemediationPolicyStatus, RemediationStatus, parse_policy_status, to_wire
from pdwarden.constants import API_VERSION, POLICY_KIND
from pdwarden.k8s import ApiError
from pdwarden.ports import KubeApi
from pdwarden.remediation.record.ledger import merge_history, missing_from

log = logging.getLogger("pdwarden.status")
MAX_ATTEMPTS: Final = 4


@dataclass(frozen=True)
class PolicyKnown:
    """A policy status and the object's resourceVersion it was read from (or written as)."""

    status: PDRemediationPolicyStatus
    resource_version: str | None


def status_from_body(body: Mapping[str, Any]) -> PDRemediationPolicyStatus:
    """The status a policy holds; keys the model does not know (kopf's) are dropped, and so is
    a top-level field that does not validate (the rest is kept)."""
    known = {f.alias or n for n, f in PDRemediationPolicyStatus.model_fields.items()}
    raw = body.get("status")
    raw = {k: v for k, v in dict(raw if isinstance(raw, Mapping) else {}).items() if k in known}
    try:
        return parse_policy_status(raw)
    except ValidationError:
        meta = body.get("metadata") or {}
        log.warning("status of %s/%s does not validate; keeping what does",
                    meta.get("namespace"), meta.get("name"))  # fmt: skip
    kept: dict[str, Any] = {}
    for key, value in raw.items():
        try:
            parse_policy_status({**kept, key: value})
        except ValidationError:
            continue
        kept[key] = value
    return parse_policy_status(kept)


def _rv(obj: Mapping[str, Any]) -> str | None:
    rv = (obj.get("metadata") or {}).get("resourceVersion")
    return str(rv) if rv else None


def known_from_body(body: Mapping[str, Any]) -> PolicyKnown:
    return PolicyKnown(status_from_body(body), _rv(body))


async def read(client: KubeApi, namespace: str, name: str) -> PolicyKnown:
    obj = await client.get(API_VERSION, POLICY_KIND, namespace, name)
    if obj is None:
        raise ApiError(404, f"{POLICY_KIND} {namespace}/{name} is gone")
    return known_from_body(obj)


def rebase(
    ours: PDRemediationPolicyStatus,
    base: PDRemediationPolicyStatus,
    theirs: PDRemediationPolicyStatus,
) -> PDRemediationPolicyStatus:
    """Ours (computed from `base`) on top of `theirs`: everything is ours (this cycle observed it
    last), except the ledger, which keeps every entry either writer recorded."""
    mine = (ours.remediation or RemediationStatus()).history
    older = (base.remediation or RemediationStatus()).history
    their_history = (theirs.remediation or RemediationStatus()).history
    history = merge_history(their_history, missing_from(older, mine))
    remediation = (ours.remediation or RemediationStatus()).model_copy(update={"history": history})
    return ours.model_copy(update={"remediation": remediation})


async def write(
    client: KubeApi,
    namespace: str,
    name: str,
    *,
    base: PolicyKnown,
    new: PDRemediationPolicyStatus,
) -> PolicyKnown:
    """Write `new` (computed from `base`) unless the object already holds it (a write only on
    material change); returns what the object holds afterwards. Raises ApiError."""
    for _ in range(MAX_ATTEMPTS):
        wire = to_wire(new)
        if wire == to_wire(base.status):
            return PolicyKnown(new, base.resource_version)
        try:
            obj = await client.patch_status(
                API_VERSION, POLICY_KIND, namespace, name, wire,
                resource_version=base.resource_version,
            )  # fmt: skip
        except ApiError as e:
            if e.status != 409:
                raise
            metrics.STATUS_CONFLICTS.inc()
            theirs = await read(client, namespace, name)
            new = rebase(new, base.status, theirs.status)
            base = theirs
            continue
        metrics.STATUS_WRITES.inc()
        return PolicyKnown(new, _rv(obj) or None)
    raise ApiError(409, f"status of {namespace}/{name} kept changing; will retry next cycle")


@dataclass
class PolicyStatusCache:
    """The last policy status this process wrote, used only while its resourceVersion is the
    object's (kopf's body lags our own writes by a watch event); otherwise read again."""

    client: KubeApi
    entries: dict[str, PolicyKnown] = field(default_factory=dict)

    async def current(self, body: Mapping[str, Any]) -> PolicyKnown:
        meta = body["metadata"]
        cached = self.entries.get(meta["uid"])
        from_body = known_from_body(body)
        if cached is None:
            return from_body
        if (
            cached.resource_version is not None
            and cached.resource_version == from_body.resource_version
        ):
            return cached
        fresh = await read(self.client, meta["namespace"], meta["name"])
        self.entries[meta["uid"]] = fresh
        return fresh

    def remember(self, uid: str, known: PolicyKnown) -> None:
        self.entries[uid] = known

    def forget(self, uid: str) -> None:
        self.entries.pop(uid, None)
