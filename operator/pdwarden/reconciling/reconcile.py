"""One reconcile pass for a PDDeployment: render, apply what differs, observe, report.

Why: this is the imperative shell around the pure parts (render, observe, plan). It is
level-based: every pass starts from the spec and what the API server shows now, so a restarted
operator or a missed event changes nothing; and it writes only what differs (workloads whose
template hash or replica count drifted, status when it materially changed, guarded by the
resourceVersion it was computed from so no other writer's ledger entries are lost).
"""

from __future__ import annotations

import asyncio
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
    status_to_wire,
)
from pdwarden.constants import (
    API_VERSION,
    FIELD_MANAGER,
    KIND,
    LABEL_ROLE,
    ROLE_DECODE,
    ROLE_PREFILL,
    ROLE_ROUTER,
)
from pdwarden.k8s import ApiError
from pdwarden.k8s.event_sink import post_event
from pdwarden.ownership import Workloads, owned_by, owned_chain
from pdwarden.ownership import selector as _selector
from pdwarden.ports import KubeApi
from pdwarden.reconciling.observe import Observed, compute_status, pod_problems
from pdwarden.reconciling.plan import (
    apply_everything,
    apply_waves,
    degraded,
    invalid_status,
    pods_to_serve,
    serving_condition,
    to_apply,
)
from pdwarden.remediation.record.store import DEPLOYMENT, Known, known_from_body, write
from pdwarden.render import Owner, names, render_deployment
from pdwarden.render.deployment import admin_secret, bootstrap_secret
from pdwarden.tokens import derive_bootstrap_token, derive_token

log = logging.getLogger("pdwarden.reconciling.reconcile")
Obj = dict[str, Any]


class TransientError(Exception):
    """The pass failed for a reason that retrying can fix (API unavailable, conflict)."""


class ConflictError(Exception):
    """A child object's name is taken by an object this PDDeployment does not own."""


class OwnerGone(Exception):
    """The PDDeployment this pass works for no longer exists (or its name holds another
    incarnation): nothing may be written for it."""


@dataclass
class PassContext:
    """What one pass knows before it acts: the object, its previous status, and the time."""

    client: KubeApi
    body: Mapping[str, Any]
    owner: Owner
    generation: int | None
    previous: Known[PDDeploymentStatus]
    now: datetime
    token_key: bytes | None = None
    operator_namespace: str | None = None  # the worker NetworkPolicy's operator peer
    ensure_secrets: bool = False  # the token key was rotated lately: recreate deleted Secrets


@dataclass
class PassResult:
    applied: list[str]
    status: Obj
    invalid: bool = False
    # What the object holds after the pass (for the status cache).
    known: Known[PDDeploymentStatus] | None = None


def owner_of(body: Mapping[str, Any]) -> Owner:
    meta = body["metadata"]
    return Owner(name=meta["name"], namespace=meta["namespace"], uid=meta["uid"])


def selector(owner: Owner, role: str | None = None) -> str:
    return _selector(owner.name, role)


async def observe(client: KubeApi, owner: Owner) -> Observed:
    sel = selector(owner)
    sts = await client.list("apps/v1", "StatefulSet", owner.namespace, sel)
    deps = await client.list("apps/v1", "Deployment", owner.namespace, sel)
    pods = await client.list("v1", "Pod", owner.namespace, sel)
    by_role: dict[str, Obj | None] = {}
    for obj in [*sts, *deps]:
        if owned_by(obj, owner.uid):
            by_role[obj["metadata"]["labels"].get(LABEL_ROLE, "")] = obj
    workloads = Workloads.of(sts, deps, owner.uid)
    return Observed(workloads=by_role, pods=[p for p in pods if owned_chain(p, workloads)])


async def _apply(client: KubeApi, owner: Owner, obj: Obj) -> None:
    """Apply `obj`, refusing to take over an object of the same name that we do not own."""
    meta = obj["metadata"]
    existing = await client.get(obj["apiVersion"], obj["kind"], owner.namespace, meta["name"])
    if existing is not None and not owned_by(existing, owner.uid):
        raise ConflictError(
            f"{obj['kind']} {meta['name']} already exists and is not owned by this PDDeployment; "
            "rename or delete it"
        )
    await client.apply(obj, FIELD_MANAGER)
    metrics.OBJECTS_APPLIED.labels(obj["kind"]).inc()


async def _apply_one(client: KubeApi, owner: Owner, obj: Obj) -> tuple[str, str | None]:
    """("Kind/name", None) when applied, else the error for status; transient errors raise."""
    name = f"{obj['kind']}/{obj['metadata']['name']}"
    try:
        await _apply(client, owner, obj)
    except ConflictError as e:
        return name, f"ConflictingObject: {e}"
    except ApiError as e:
        if e.transient:
            raise
        return name, f"ApplyFailed: {obj['kind']} {obj['metadata']['name']}: {e.reason}"
    return name, None


async def _ensure_secret(client: KubeApi, owner: Owner, token_key: bytes | None) -> None:
    """Create the admin-token Secret once. With a token key the operator never reads Secrets."""
    if token_key is not None:
        token = derive_token(token_key, owner.namespace, owner.name, owner.uid)
        key = derive_bootstrap_token(token_key, owner.namespace, owner.name, owner.uid)
        await asyncio.gather(  # None (409) when one already exists
            client.create(admin_secret(owner, token)), client.create(bootstrap_secret(owner, key))
        )
        return
    n = names(owner.name)
    if await client.get("v1", "Secret", owner.namespace, n.admin_secret) is None:
        await client.create(admin_secret(owner, secrets.token_urlsafe(32)))
    if await client.get("v1", "Secret", owner.namespace, n.bootstrap_secret) is None:
        await client.create(bootstrap_secret(owner, secrets.token_urlsafe(32)))


async def _serve_new_decode_pods(client: KubeApi, observed: Observed) -> None:
    """Decode pods start with no serving condition; set it True so they can become Ready."""
    condition = serving_condition(datetime.now(UTC))
    for namespace, name in pods_to_serve(observed.pods):
        try:
            await client.set_pod_condition(namespace, name, condition)
        except ApiError as e:
            if e.transient:
                raise
            metrics.ERRORS.labels("reconcile").inc()  # gone meanwhile: the next pass sees it
            log.info("%s/%s: cannot mark serving: %s", namespace, name, e)


async def _still_there(client: KubeApi, owner: Owner) -> None:
    """Raise OwnerGone unless the PDDeployment exists as this incarnation. Asked before a pass
    that kopf's own handlers did not start writes anything (one GET, only then): kopf never
    hears of an object deleted while its watch was down (after 410 Gone it lists again, and a
    list says what exists, not what vanished), so its daemons live on, and such a pass would
    recreate the children the garbage collector has just removed."""
    current = await client.get(API_VERSION, KIND, owner.namespace, owner.name)
    if current is None or (current.get("metadata") or {}).get("uid") != owner.uid:
        raise OwnerGone(f"{owner.namespace}/{owner.name} (uid {owner.uid}) no longer exists")


async def reconcile(
    client: KubeApi,
    body: Mapping[str, Any],
    force_apply: bool,
    token_key: bytes | None = None,
    previous: Known[PDDeploymentStatus] | None = None,
    *,
    operator_namespace: str | None = None,
    ensure_secrets: bool = False,
) -> PassResult:
    """Run one pass. Raises TransientError when the API server failed us (retry later).
    `ensure_secrets`: create the Secrets if missing on this pass whatever else it does (after
    a token key rotation their owner deletes them, and running pods do not fail for it)."""
    started = time.monotonic()
    owner = owner_of(body)
    generation = body["metadata"].get("generation")
    if previous is None:
        previous = known_from_body(DEPLOYMENT, body)
    now = datetime.now(UTC).replace(microsecond=0)
    ctx = PassContext(
        client, body, owner, generation, previous, now, token_key, operator_namespace,
        ensure_secrets,
    )  # fmt: skip
    try:
        try:
            spec = parse_spec(body.get("spec") or {})
        except InvalidSpec as e:
            return await _report_invalid(ctx, e)
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
    client, owner, previous = ctx.client, ctx.owner, ctx.previous.status
    everything = force_apply or apply_everything(previous, ctx.generation)
    desired = render_deployment(owner, spec, ctx.operator_namespace)
    observed = await observe(client, owner)
    writes = to_apply(desired, observed, everything=everything)
    secret = everything or ctx.ensure_secrets or pod_problems(observed.pods)
    if (writes or secret) and not force_apply:
        await _still_there(client, owner)
    if secret:
        # With the other non-workload objects (create, update, resume, a spec change, a failing
        # apply), and whenever a pod is failing (a deleted Secret shows as one); not on every
        # resync, where it cost two requests per deployment, answered 409; on every pass only
        # for a while after the token key was rotated (`TokenKey.rotated_lately`).
        await _ensure_secret(client, owner, ctx.token_key)
    applied: list[str] = []
    apply_error: str | None = None
    for wave in apply_waves(writes):
        # A wave's objects at once: a pass is two round trips deep, not one per object (a
        # burst of created deployments waited seconds on sequential applies; issue 27).
        outcomes = await asyncio.gather(*(_apply_one(client, owner, obj) for obj in wave))
        for name, error in outcomes:
            if error is None:
                applied.append(name)
            else:
                apply_error = error
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
    changed = status_to_wire(status) != status_to_wire(previous)
    known = await write(
        DEPLOYMENT, client, owner.namespace, owner.name, base=ctx.previous, new=status
    )
    if changed and apply_error and apply_error not in degraded(previous)[1]:
        await post_event(client, dict(ctx.body), "ApplyFailed", apply_error, "Warning")
    if applied:
        log.info("%s/%s: applied %s", owner.namespace, owner.name, ", ".join(applied))
    return PassResult(applied=applied, status=status_to_wire(known.status), known=known)


async def _report_invalid(ctx: PassContext, error: InvalidSpec) -> PassResult:
    """A spec that slipped past the schema: say why in status and an Event, never retry."""
    metrics.RECONCILES.labels("invalid_spec").inc()
    message = f"invalid spec: {error}"
    status = invalid_status(ctx.previous.status, message, ctx.now, ctx.generation)
    owner = ctx.owner
    known = await write(DEPLOYMENT, client=ctx.client, namespace=owner.namespace, name=owner.name,
                        base=ctx.previous, new=status)  # fmt: skip
    if status_to_wire(status) != status_to_wire(ctx.previous.status):
        await post_event(ctx.client, dict(ctx.body), "InvalidSpec", message, "Warning")
    return PassResult(applied=[], status=status_to_wire(known.status), invalid=True, known=known)
