"""One reconcile pass for a PDDeployment: render, apply what differs, observe, report.

Why: this is the imperative shell around the pure parts (render, observe). It is level-based:
every pass starts from the spec and what the API server shows now, so a restarted operator or a
missed event changes nothing; and it writes only what differs (workloads whose template hash or
replica count drifted, status when it materially changed).
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pdwarden import metrics
from pdwarden.api import (
    InvalidSpec,
    PDDeploymentSpec,
    PDDeploymentStatus,
    parse_spec,
    parse_status,
    status_to_wire,
)
from pdwarden.conditions import set_condition
from pdwarden.constants import (
    ANNOTATION_TEMPLATE_HASH,
    API_VERSION,
    CONDITION_SERVING,
    FIELD_MANAGER,
    KIND,
    LABEL_DEPLOYMENT,
    LABEL_ROLE,
    ROLE_DECODE,
    ROLE_PREFILL,
    ROLE_ROUTER,
)
from pdwarden.k8s import ApiError, KubeClient
from pdwarden.k8s.events import post_event
from pdwarden.observe import Observed, compute_status
from pdwarden.render import Owner, names, render_deployment
from pdwarden.render.deployment import admin_secret, bootstrap_secret
from pdwarden.tokens import derive_bootstrap_token, derive_token

log = logging.getLogger("pdwarden.reconcile")
Obj = dict[str, Any]
WORKLOAD_KINDS = {"StatefulSet", "Deployment"}


class TransientError(Exception):
    """The pass failed for a reason that retrying can fix (API unavailable, conflict)."""


@dataclass
class PassContext:
    """What one pass knows before it acts: the object, its previous status, and the time."""

    client: KubeClient
    body: Mapping[str, Any]
    owner: Owner
    generation: int | None
    previous: PDDeploymentStatus
    now: datetime
    token_key: bytes | None = None


@dataclass
class PassResult:
    applied: list[str]
    status: Obj
    invalid: bool = False


def owner_of(body: Mapping[str, Any]) -> Owner:
    meta = body["metadata"]
    return Owner(name=meta["name"], namespace=meta["namespace"], uid=meta["uid"])


def selector(owner: Owner, role: str | None = None) -> str:
    sel = f"{LABEL_DEPLOYMENT}={owner.name}"
    return sel + (f",{LABEL_ROLE}={role}" if role else "")


async def observe(client: KubeClient, owner: Owner) -> Observed:
    sel = selector(owner)
    sts = await client.list("apps/v1", "StatefulSet", owner.namespace, sel)
    deps = await client.list("apps/v1", "Deployment", owner.namespace, sel)
    pods = await client.list("v1", "Pod", owner.namespace, sel)
    by_role: dict[str, Obj | None] = {}
    for obj in [*sts, *deps]:
        if _owned_by(obj, owner):
            by_role[obj["metadata"]["labels"].get(LABEL_ROLE, "")] = obj
    return Observed(workloads=by_role, pods=[p for p in pods if _owned_chain(p)])


def _owned_by(obj: Obj, owner: Owner) -> bool:
    refs = obj["metadata"].get("ownerReferences") or []
    return any(r.get("uid") == owner.uid for r in refs)


def _owned_chain(pod: Obj) -> bool:
    # Pods are owned by a StatefulSet or ReplicaSet that we own; the label is enough here.
    return bool(pod["metadata"].get("ownerReferences"))


def _drifted(desired: Obj, observed: Observed) -> bool:
    role = desired["metadata"]["labels"].get(LABEL_ROLE, "")
    current = observed.workloads.get(role)
    if current is None:
        return True
    want_hash = desired["metadata"]["annotations"][ANNOTATION_TEMPLATE_HASH]
    have_hash = (current["metadata"].get("annotations") or {}).get(ANNOTATION_TEMPLATE_HASH)
    return bool(
        have_hash != want_hash or current["spec"].get("replicas") != desired["spec"]["replicas"]
    )


async def _apply(client: KubeClient, owner: Owner, obj: Obj) -> None:
    """Apply `obj`, refusing to take over an object of the same name that we do not own."""
    meta = obj["metadata"]
    existing = await client.get(obj["apiVersion"], obj["kind"], owner.namespace, meta["name"])
    if existing is not None and not _owned_by(existing, owner):
        raise ConflictError(
            f"{obj['kind']} {meta['name']} already exists and is not owned by this PDDeployment; "
            "rename or delete it"
        )
    await client.apply(obj, FIELD_MANAGER)
    metrics.OBJECTS_APPLIED.labels(obj["kind"]).inc()


class ConflictError(Exception):
    """A child object's name is taken by an object this PDDeployment does not own."""


async def _ensure_secret(client: KubeClient, owner: Owner, token_key: bytes | None) -> None:
    """Create the admin-token Secret once. With a token key the operator never reads Secrets."""
    if token_key is not None:
        token = derive_token(token_key, owner.namespace, owner.name, owner.uid)
        await client.create(admin_secret(owner, token))  # None (409) when it already exists
        key = derive_bootstrap_token(token_key, owner.namespace, owner.name, owner.uid)
        await client.create(bootstrap_secret(owner, key))
        return
    n = names(owner.name)
    if await client.get("v1", "Secret", owner.namespace, n.admin_secret) is None:
        await client.create(admin_secret(owner, secrets.token_urlsafe(32)))
    if await client.get("v1", "Secret", owner.namespace, n.bootstrap_secret) is None:
        await client.create(bootstrap_secret(owner, secrets.token_urlsafe(32)))


async def _serve_new_decode_pods(client: KubeClient, observed: Observed) -> None:
    """Decode pods start with no serving condition; set it True so they can become Ready.

    A pod that has the condition (True, or False because remediation cordoned it) is left alone.
    """
    now = datetime.now(UTC).isoformat().replace("+00:00", "Z")
    for pod in observed.pods:
        meta = pod["metadata"]
        if (meta.get("labels") or {}).get(LABEL_ROLE) != ROLE_DECODE or meta.get(
            "deletionTimestamp"
        ):
            continue
        conditions = (pod.get("status") or {}).get("conditions") or []
        if any(c.get("type") == CONDITION_SERVING for c in conditions):
            continue
        await client.set_pod_condition(
            meta["namespace"],
            meta["name"],
            {
                "type": CONDITION_SERVING,
                "status": "True",
                "reason": "Serving",
                "message": "pdwarden: not cordoned",
                "lastTransitionTime": now,
            },
        )


async def reconcile(
    client: KubeClient,
    body: Mapping[str, Any],
    force_apply: bool,
    token_key: bytes | None = None,
    previous: PDDeploymentStatus | None = None,
) -> PassResult:
    """Run one pass. Raises TransientError when the API server failed us (retry later)."""
    started = time.monotonic()
    owner = owner_of(body)
    generation = body["metadata"].get("generation")
    if previous is None:
        previous = status_from_body(body)
    now = datetime.now(UTC).replace(microsecond=0)
    ctx = PassContext(client, body, owner, generation, previous, now, token_key)
    try:
        spec = parse_spec(body.get("spec") or {})
    except InvalidSpec as e:
        return await _report_invalid(ctx, e)
    try:
        result = await _reconcile_valid(ctx, spec, force_apply)
    except ApiError as e:
        metrics.RECONCILES.labels("error").inc()
        raise TransientError(str(e)) from e
    metrics.RECONCILES.labels("ok").inc()
    metrics.RECONCILE_SECONDS.observe(time.monotonic() - started)
    return result


async def _reconcile_valid(
    ctx: PassContext, spec: PDDeploymentSpec, force_apply: bool
) -> PassResult:
    client, owner, previous = ctx.client, ctx.owner, ctx.previous
    await _ensure_secret(client, owner, ctx.token_key)
    desired = render_deployment(owner, spec)
    observed = await observe(client, owner)
    # Re-apply everything after a spec change, and on every pass while the last apply failed
    # (a 403 fixed by an admin, a conflicting object deleted): level-based, bounded by the resync.
    spec_changed = previous.observed_generation != ctx.generation or _degraded_reason(previous) in (
        "ApplyFailed",
        "ConflictingObject",
    )
    applied: list[str] = []
    apply_error: str | None = None
    for obj in desired:
        is_workload = obj["kind"] in WORKLOAD_KINDS
        if force_apply or spec_changed or (is_workload and _drifted(obj, observed)):
            try:
                await _apply(client, owner, obj)
            except ConflictError as e:
                apply_error = f"ConflictingObject: {e}"
                continue
            except ApiError as e:
                if e.transient:
                    raise
                apply_error = f"ApplyFailed: {obj['kind']} {obj['metadata']['name']}: {e.reason}"
                continue
            applied.append(f"{obj['kind']}/{obj['metadata']['name']}")
    if applied:
        observed = await observe(client, owner)
    await _serve_new_decode_pods(client, observed)
    selectors = {r: selector(owner, r) for r in (ROLE_PREFILL, ROLE_DECODE, ROLE_ROUTER)}
    status = compute_status(
        spec,
        observed,
        previous,
        generation=ctx.generation,
        now=ctx.now,
        selectors=selectors,
        apply_error=apply_error,
    )
    wire = status_to_wire(status)
    if wire != status_to_wire(previous):
        await client.patch_status(API_VERSION, KIND, owner.namespace, owner.name, wire)
        metrics.STATUS_WRITES.inc()
        if apply_error and apply_error not in _degraded_message(previous):
            await post_event(client, dict(ctx.body), "ApplyFailed", apply_error, "Warning")
    if applied:
        log.info("%s/%s: applied %s", owner.namespace, owner.name, ", ".join(applied))
    return PassResult(applied=applied, status=wire)


def _degraded_reason(status: PDDeploymentStatus) -> str:
    return next((c.reason for c in status.conditions if c.type == "Degraded"), "")


def _degraded_message(status: PDDeploymentStatus) -> str:
    return next((c.message for c in status.conditions if c.type == "Degraded"), "")


def status_from_body(body: Mapping[str, Any]) -> PDDeploymentStatus:
    return parse_status(_known_status(body.get("status")))


def _known_status(raw: Any) -> dict[str, Any]:
    """Drop status keys the model does not know (e.g. kopf's own bookkeeping)."""
    known = {f.alias or n for n, f in PDDeploymentStatus.model_fields.items()}
    return {k: v for k, v in dict(raw or {}).items() if k in known}


async def _report_invalid(ctx: PassContext, error: InvalidSpec) -> PassResult:
    """A spec that slipped past the schema: say why in status and an Event, never retry."""
    metrics.RECONCILES.labels("invalid_spec").inc()
    message = f"invalid spec: {error}"
    previous, now, generation = ctx.previous, ctx.now, ctx.generation
    conditions = set_condition(
        list(previous.conditions),
        "Degraded",
        status=True,
        reason="InvalidSpec",
        message=message,
        now=now,
        generation=generation,
    )
    conditions = set_condition(
        conditions,
        "Ready",
        status=False,
        reason="InvalidSpec",
        message=message,
        now=now,
        generation=generation,
    )
    status = previous.model_copy(
        update={"observed_generation": generation, "phase": "Failed", "conditions": conditions}
    )
    wire = status_to_wire(status)
    owner = ctx.owner
    if wire != status_to_wire(previous):
        await ctx.client.patch_status(API_VERSION, KIND, owner.namespace, owner.name, wire)
        await post_event(ctx.client, dict(ctx.body), "InvalidSpec", message, "Warning")
    return PassResult(applied=[], status=wire, invalid=True)
