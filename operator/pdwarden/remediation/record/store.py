"""Status writes that never lose another writer's work: resourceVersion-guarded, merged on conflict.

Why: two writers touch a PDDeployment's status, reconcile and remediation, and after an HA
failover also two operator processes, each with its own memory of the last status it wrote. A
merge patch replaces `remediation.history` wholesale, so a write based on an older copy would
erase ledger entries (and with them cooldowns and the breaker's count). Every write here carries
the resourceVersion it was computed from; on 409 the object is read again and our change is
re-applied on top (the ledger is the union of both). The per-process cache is used only while it
is provably current (its resourceVersion is the object's), so a stale cache never wins over the
object's status.

One store serves both kinds; each is a `StatusKind` (its kind, status model and how ours is
re-applied on theirs): `DEPLOYMENT` (a three-way merge, `ledger.rebase`, since reconcile and
remediation each own fields) and `POLICY` (one writer per policy: ours, with the union ledger).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Generic, TypeVar

from pydantic import ValidationError

from pdwarden import metrics
from pdwarden.api import (
    PDDeploymentStatus,
    PDRemediationPolicyStatus,
    RemediationStatus,
    to_wire,
)
from pdwarden.api.base import StatusModel
from pdwarden.constants import API_VERSION, KIND, POLICY_KIND
from pdwarden.k8s import ApiError
from pdwarden.ports import KubeApi
from pdwarden.remediation.record.ledger import merge_history, missing_from, rebase

log = logging.getLogger("pdwarden.status")
MAX_ATTEMPTS: Final = 4
_COMPARABLE: Final = re.compile(r"[1-9][0-9]*")

S = TypeVar("S", bound=StatusModel)


def rebase_ledger(
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


@dataclass(frozen=True)
class StatusKind(Generic[S]):
    """What differs between the kinds: the kind, its status model, and the conflict merge."""

    kind: str
    model: type[S]
    rebase: Callable[[S, S, S], S]

    def parse(self, raw: Mapping[str, Any] | None) -> S:
        return self.model.model_validate(dict(raw or {}), by_alias=True, by_name=False)


DEPLOYMENT: Final = StatusKind(KIND, PDDeploymentStatus, rebase)
POLICY: Final = StatusKind(POLICY_KIND, PDRemediationPolicyStatus, rebase_ledger)


@dataclass(frozen=True)
class Known(Generic[S]):
    """A status and the object's resourceVersion it was read from (or written as)."""

    status: S
    resource_version: str | None


def _rv(obj: Mapping[str, Any]) -> str | None:
    rv = (obj.get("metadata") or {}).get("resourceVersion")
    return str(rv) if rv else None


def compare_versions(a: str | None, b: str | None) -> int | None:
    """-1, 0 or 1 as resourceVersion `a` is older than, the same as or newer than `b`; None when
    either is not comparable. Kubernetes 1.35 makes them comparable between objects of one kind
    (KEP-5504, GA): decimal integers without leading zeros, ordered by length, then digit by
    digit. Anything else (absent, another storage's format) is left to a read."""
    if not (a and b and _COMPARABLE.fullmatch(a) and _COMPARABLE.fullmatch(b)):
        return None
    ka, kb = (len(a), a), (len(b), b)
    return (ka > kb) - (ka < kb)


def status_from_body(kind: StatusKind[S], body: Mapping[str, Any]) -> S:
    """The status an object holds; keys the model does not know (kopf's) are dropped, and so is
    any part that does not validate (hand-edited, or written by another version), ledger entry
    by ledger entry, so one bad entry never costs the rest of the ledger."""
    known = {f.alias or n for n, f in kind.model.model_fields.items()}
    raw = body.get("status")
    raw = {k: v for k, v in dict(raw if isinstance(raw, Mapping) else {}).items() if k in known}
    try:
        return kind.parse(raw)
    except ValidationError:
        log.warning("status of %s does not validate; keeping what does", _name(body))
    kept: dict[str, Any] = {}
    for key, value in raw.items():
        clean = (
            _valid_remediation(kind, value)
            if key == "remediation" and isinstance(value, Mapping)
            else value
        )
        if _valid(kind, {key: clean}):
            kept[key] = clean
    return kind.parse(kept)


def _valid_remediation(kind: StatusKind[S], raw: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in raw.items():
        clean = value
        if key == "history" and isinstance(value, list):
            clean = [e for e in value if _valid(kind, {"remediation": {"history": [e]}})]
        if _valid(kind, {"remediation": {key: clean}}):
            out[key] = clean
    return out


def _valid(kind: StatusKind[S], raw: Mapping[str, Any]) -> bool:
    try:
        kind.parse(raw)
    except ValidationError:
        return False
    return True


def _name(body: Mapping[str, Any]) -> str:
    meta = body.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"


def known_from_body(kind: StatusKind[S], body: Mapping[str, Any]) -> Known[S]:
    return Known(status_from_body(kind, body), _rv(body))


async def read(kind: StatusKind[S], client: KubeApi, namespace: str, name: str) -> Known[S]:
    obj = await client.get(API_VERSION, kind.kind, namespace, name)
    if obj is None:
        raise ApiError(404, f"{kind.kind} {namespace}/{name} is gone")
    return known_from_body(kind, obj)


async def write(
    kind: StatusKind[S], client: KubeApi, namespace: str, name: str, *, base: Known[S], new: S
) -> Known[S]:
    """Write `new` (computed from `base`) unless the object already holds it; returns what the
    object holds afterwards. Raises ApiError if the API server fails us."""
    for _ in range(MAX_ATTEMPTS):
        wire = to_wire(new)
        if wire == to_wire(base.status):
            return Known(new, base.resource_version)
        try:
            obj = await client.patch_status(
                API_VERSION,
                kind.kind,
                namespace,
                name,
                wire,
                resource_version=base.resource_version,
            )
        except ApiError as e:
            if e.status != 409:
                raise
            metrics.STATUS_CONFLICTS.inc()
            theirs = await read(kind, client, namespace, name)
            new = kind.rebase(new, base.status, theirs.status)
            base = theirs
            continue
        metrics.STATUS_WRITES.inc()
        return Known(new, _rv(obj) or None)
    raise ApiError(409, f"status of {namespace}/{name} kept changing; will retry next cycle")


@dataclass
class StatusCache(Generic[S]):
    """The last status this process wrote or read, per object UID, with its resourceVersion.

    kopf's body lags our own writes by a watch event; the cache bridges that lag. Which of the
    two is newer is told by their resourceVersions, comparable since Kubernetes 1.35 (KEP-5504);
    the newer one is used, so another writer's newer status always wins and no GET is spent on
    our own write's echo. Only versions that are not comparable (another storage) are settled
    by reading the object again.
    """

    kind: StatusKind[S]
    client: KubeApi
    entries: dict[str, Known[S]] = field(default_factory=dict)

    async def current(self, body: Mapping[str, Any]) -> Known[S]:
        meta = body["metadata"]
        cached = self.entries.get(meta["uid"])
        from_body = known_from_body(self.kind, body)
        if cached is None:
            return from_body
        order = compare_versions(cached.resource_version, from_body.resource_version)
        if order is not None and order >= 0:
            return cached  # the body lags our own write (or is that very write)
        if order is not None:
            # Newer than ours: another write (kopf's annotations, another replica) that the
            # watch has already brought; a GET would tell no more.
            self.entries[meta["uid"]] = from_body
            return from_body
        metrics.STATUS_READS.inc()
        fresh = await read(self.kind, self.client, meta["namespace"], meta["name"])
        self.entries[meta["uid"]] = fresh
        return fresh

    def remember(self, uid: str, known: Known[S]) -> None:
        self.entries[uid] = known

    def forget(self, uid: str) -> None:
        self.entries.pop(uid, None)
