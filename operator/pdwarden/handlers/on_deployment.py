"""What the kopf handlers do, as plain async functions (registration lives in main.py).

Why separate: these functions can be imported and called without a kopf registry (the
in-process tests in tests/shell do), they turn results into kopf's retry vocabulary, serialize
every pass over one object (reconcile and remediation both write its status), and contain every
error: a remediation cycle that fails is counted and logged and the next one runs on time; a
reconcile pass that fails becomes a kopf retry, never a dead daemon.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf

from pdwarden import metrics
from pdwarden.api import InvalidSpec, PDDeploymentSpec, PDDeploymentStatus, parse_spec
from pdwarden.constants import KIND
from pdwarden.handlers.daemon import daemon_cycle, names, tools_for, vanished
from pdwarden.k8s import ApiError, throttled_budget
from pdwarden.ports import AdminApi, CanaryApi, KubeApi, PairCanaryApi, ScreenApi, WorkerApi
from pdwarden.reconciling.reconcile import OwnerGone, PassResult, TransientError, reconcile
from pdwarden.remediation.act.sglang_abort import PrefillAborter
from pdwarden.remediation.act.worker_admin import WorkerAdmin
from pdwarden.remediation.kinds.deployment_kind import DeploymentKind
from pdwarden.remediation.memory import DeploymentMemory
from pdwarden.remediation.record.ledger import mode_off_status
from pdwarden.remediation.record.store import DEPLOYMENT, StatusCache, write
from pdwarden.remediation.scrape.worker_client import WorkerClient
from pdwarden.remediation.seams import Tools, now_utc
from pdwarden.tokens import TokenKey

log = logging.getLogger("pdwarden.handlers.on_deployment")
RETRY_DELAY = 5.0
# A reconcile pass holds its deployment's lock, which the remediation cycle takes every
# interval: a throttled pass waits out about one Retry-After (the API server asks 1-4 s), then
# gives way and kopf runs it again after RETRY_DELAY (measured: with the whole call timeout,
# a pass throttled for 15 s kept the cycle from judging a live wedge all that time).
LOCKED_THROTTLE_BUDGET = 2.0


@dataclass
class OperatorState:
    """Process-wide state kept in kopf's memo: clients, per-object locks, last status written,
    and what remediation remembers of each object between cycles."""

    client: KubeApi
    token_key: TokenKey | bytes | None = None  # bytes: a fixed key
    global_dry_run: bool = False
    operator_namespace: str | None = None  # where this operator runs (None: outside the cluster)
    workers: WorkerApi = field(default_factory=WorkerClient)
    admin: AdminApi = field(default_factory=WorkerAdmin)
    sglang: PrefillAborter | None = None
    canary: CanaryApi | None = None  # default: on the tenant shares of `workers`
    pair: PairCanaryApi | None = None  # default: on the tenant shares of `workers`
    screen: ScreenApi | None = None  # prometheus mode's screen (None: direct mode)
    locks: dict[str, asyncio.Lock] = field(default_factory=dict)
    known: set[str] = field(default_factory=set)
    # UIDs of objects found deleted behind kopf's back (`handlers.daemon.vanished`): their
    # daemons stop, nothing more is written for them.
    gone: set[str] = field(default_factory=set)
    statuses: StatusCache[PDDeploymentStatus] = field(init=False)
    key: TokenKey | None = field(init=False)
    kind: DeploymentKind = field(init=False)
    tools: Tools = field(init=False)
    memory: dict[str, DeploymentMemory] = field(default_factory=dict)
    # Finished cycles and passes per object UID (also exported as metrics): progress that a
    # test can wait for before asserting that nothing happened.
    cycles: Counter[str] = field(default_factory=Counter)
    passes: Counter[str] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        self.statuses = StatusCache(DEPLOYMENT, self.client)
        self.key = TokenKey.of(self.token_key)
        self.kind = DeploymentKind(self.client, self.key)
        self.tools = tools_for(
            self.client, self.workers, self.admin, self.sglang, self.canary, pair=self.pair,
            screen=self.screen,
        )  # fmt: skip

    def lock_for(self, uid: str) -> asyncio.Lock:
        return self.locks.setdefault(uid, asyncio.Lock())


async def reconcile_now(
    state: OperatorState, body: Mapping[str, Any], force_apply: bool
) -> PassResult:
    """One reconcile pass; any failure becomes kopf.TemporaryError (retried), counted."""
    uid = body["metadata"]["uid"]
    if uid in state.gone:
        return PassResult(applied=[], status={})
    try:
        async with state.lock_for(uid):
            with throttled_budget(LOCKED_THROTTLE_BUDGET):
                # Read under the lock: the resync daemon's first pass waits here while kopf's
                # create handler applies everything; it must not apply everything again.
                first_time = uid not in state.known
                previous = await state.statuses.current(body)
                result = await reconcile(
                    state.client,
                    body,
                    force_apply=force_apply or first_time,
                    token_key=state.key.current() if state.key else None,
                    ensure_secrets=state.key.rotated_lately() if state.key else False,
                    previous=previous,
                    operator_namespace=state.operator_namespace,
                )
                if result.known is not None:
                    state.statuses.remember(uid, result.known)
                state.known.add(uid)
    except OwnerGone as e:
        found_gone(state, body, str(e))
        return PassResult(applied=[], status={})
    except (TransientError, ApiError) as e:
        cause = e if isinstance(e, ApiError) else e.__cause__
        if isinstance(cause, ApiError) and cause.status == 404:
            with contextlib.suppress(ApiError):
                if await vanished(state.client, KIND, body):
                    found_gone(state, body, f"its status write found no object: {cause}")
                    return PassResult(applied=[], status={})
        raise kopf.TemporaryError(f"API server error, retrying: {e}", delay=RETRY_DELAY) from e
    except Exception as e:
        metrics.ERRORS.labels("reconcile").inc()
        metrics.RECONCILES.labels("error").inc()
        log.exception("%s/%s: reconcile pass failed", *names(body))
        raise kopf.TemporaryError(f"reconcile failed: {e}", delay=RETRY_DELAY) from e
    finally:
        state.passes[uid] += 1
        metrics.RECONCILE_PASSES.labels(*names(body)).inc()
    metrics.MANAGED.set(len(state.known))
    return result


def effective_spec(state: OperatorState, body: Mapping[str, Any]) -> PDDeploymentSpec | None:
    """The spec remediation runs with (global dry run applied), or None if there is nothing to
    do (an invalid spec, which reconcile reports; or mode Off)."""
    try:
        spec = parse_spec(body.get("spec") or {})
    except InvalidSpec:
        return None
    if state.global_dry_run and spec.remediation.mode == "Enforce":
        spec = spec.model_copy(
            update={"remediation": spec.remediation.model_copy(update={"mode": "DryRun"})}
        )
    return None if spec.remediation.mode == "Off" else spec


async def remediation_cycle(state: OperatorState, body: Mapping[str, Any]) -> float:
    """One scrape-detect-remediate cycle; returns the seconds until the next one. Never raises
    (except cancellation): a failed cycle is logged and counted, and the next one runs."""
    return await daemon_cycle(
        state, body, lambda: effective_spec(state, body), parse=parse_spec, stage="cycle",
        what="remediation cycle", counter=metrics.REMEDIATION_CYCLES,
        idle=lambda: report_mode_off(state, body),
    )  # fmt: skip


def is_gone(state: OperatorState, body: Mapping[str, Any]) -> bool:
    """Whether the object was found deleted behind kopf's back: its daemons end, each calling
    `forget` on its way out (kopf's delete handler never runs for it)."""
    return str(body["metadata"]["uid"]) in state.gone


def found_gone(state: OperatorState, body: Mapping[str, Any], why: str) -> None:
    state.gone.add(str(body["metadata"]["uid"]))
    log.warning("%s/%s: deleted while unwatched (%s); its daemons stop", *names(body), why)


async def report_mode_off(state: OperatorState, body: Mapping[str, Any]) -> None:
    """No cycle runs: with mode Off the status says so (written only on change); an invalid
    spec is reconcile's to report (Degraded, InvalidSpec)."""
    try:
        if parse_spec(body.get("spec") or {}).remediation.mode != "Off":
            return
    except InvalidSpec:
        return
    uid = str(body["metadata"]["uid"])
    namespace, name = names(body)
    async with state.lock_for(uid):
        previous = await state.statuses.current(body)
        status = mode_off_status(
            previous.status, now=now_utc(), generation=body["metadata"].get("generation")
        )
        known = await write(DEPLOYMENT, state.client, namespace, name, base=previous, new=status)
        state.statuses.remember(uid, known)
    for gauge in metrics.PER_OBJECT:
        gauge.labels(KIND, namespace, name).set(0)


def forget(state: OperatorState, body: Mapping[str, Any]) -> None:
    uid = body["metadata"]["uid"]
    state.known.discard(uid)
    state.locks.pop(uid, None)
    state.statuses.forget(uid)
    state.cycles.pop(uid, None)
    state.passes.pop(uid, None)
    for gauge in metrics.PER_DEPLOYMENT:
        with contextlib.suppress(KeyError):
            gauge.remove(*names(body))
    for per_object in metrics.PER_OBJECT:
        with contextlib.suppress(KeyError):
            per_object.remove(KIND, *names(body))
    state.memory.pop(uid, None)
    state.workers.forget(uid)
    metrics.MANAGED.set(len(state.known))
