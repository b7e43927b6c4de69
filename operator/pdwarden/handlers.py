"""What the kopf handlers do, as plain async functions (registration lives in main.py).

Why separate: these functions can be imported and called without a kopf registry; they turn
results into kopf's retry vocabulary, serialize every pass over one object (reconcile and
remediation both write its status), and remember the last status written so the two writers
never undo each other with a stale copy.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf

from pdwarden import metrics
from pdwarden.api import (
    InvalidSpec,
    PDDeploymentStatus,
    parse_spec,
    parse_status,
    status_to_wire,
)
from pdwarden.constants import API_VERSION, KIND
from pdwarden.k8s import ApiError, KubeClient
from pdwarden.reconcile import PassResult, TransientError, reconcile, status_from_body
from pdwarden.remediate import Remediator
from pdwarden.scraping import WorkerClient

log = logging.getLogger("pdwarden.handlers")
RETRY_DELAY = 5.0
IDLE_INTERVAL = 5.0


@dataclass
class OperatorState:
    """Process-wide state kept in kopf's memo: clients, per-object locks, last status written."""

    client: KubeClient
    token_key: bytes | None = None
    global_dry_run: bool = False
    workers: WorkerClient = field(default_factory=WorkerClient)
    locks: dict[str, asyncio.Lock] = field(default_factory=dict)
    known: set[str] = field(default_factory=set)
    statuses: dict[str, dict[str, Any]] = field(default_factory=dict)
    remediator: Remediator | None = None

    def __post_init__(self) -> None:
        self.remediator = Remediator(self.client, self.workers, self.token_key)

    def lock_for(self, uid: str) -> asyncio.Lock:
        return self.locks.setdefault(uid, asyncio.Lock())

    def previous_status(self, body: Mapping[str, Any]) -> PDDeploymentStatus:
        cached = self.statuses.get(body["metadata"]["uid"])
        return parse_status(cached) if cached is not None else status_from_body(body)


async def reconcile_now(
    state: OperatorState, body: Mapping[str, Any], force_apply: bool
) -> PassResult:
    uid = body["metadata"]["uid"]
    first_time = uid not in state.known
    async with state.lock_for(uid):
        try:
            result = await reconcile(
                state.client,
                body,
                force_apply=force_apply or first_time,
                token_key=state.token_key,
                previous=state.previous_status(body),
            )
        except TransientError as e:
            raise kopf.TemporaryError(f"API server error, retrying: {e}", delay=RETRY_DELAY) from e
        state.statuses[uid] = result.status
    state.known.add(uid)
    metrics.MANAGED.set(len(state.known))
    return result


async def remediation_cycle(state: OperatorState, body: Mapping[str, Any]) -> float:
    """One scrape-detect-remediate cycle; returns the seconds until the next one."""
    try:
        spec = parse_spec(body.get("spec") or {})
    except InvalidSpec:
        return IDLE_INTERVAL  # reconcile reports it; nothing to scrape
    if state.global_dry_run and spec.remediation.mode == "Enforce":
        spec = spec.model_copy(
            update={"remediation": spec.remediation.model_copy(update={"mode": "DryRun"})}
        )
    if spec.remediation.mode == "Off":
        return IDLE_INTERVAL
    meta = body["metadata"]
    uid = meta["uid"]
    assert state.remediator is not None
    async with state.lock_for(uid):
        previous = state.previous_status(body)
        try:
            result = await state.remediator.cycle(body, spec, previous)
            wire = status_to_wire(result.status)
            if wire != status_to_wire(previous):
                await state.client.patch_status(
                    API_VERSION, KIND, meta["namespace"], meta["name"], wire
                )
                metrics.STATUS_WRITES.inc()
                state.statuses[uid] = wire
        except ApiError as e:
            log.warning("%s/%s: remediation cycle failed: %s", meta["namespace"], meta["name"], e)
    return float(spec.remediation.scrape_interval_seconds)


def forget(state: OperatorState, body: Mapping[str, Any]) -> None:
    uid = body["metadata"]["uid"]
    state.known.discard(uid)
    state.locks.pop(uid, None)
    state.statuses.pop(uid, None)
    meta = body["metadata"]
    for gauge in (metrics.REMEDIATION_SUSPENDED, metrics.WEDGED_ROOMS):
        with contextlib.suppress(KeyError):
            gauge.remove(meta["namespace"], meta["name"])
    if state.remediator is not None:
        state.remediator.forget(uid)
    metrics.MANAGED.set(len(state.known))
