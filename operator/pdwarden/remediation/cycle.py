"""One scrape-detect-remediate cycle for a PDDeployment: the imperative shell of remediation.

Why: detection, policy and record-keeping are pure (`views`, `detect`, `policy`,
`ledger`); this module only fetches their inputs (our pods from the API server, samples from
the workers), performs the plan (admin API, pod conditions, pod deletes) and posts Events. Every
error is contained where it happens: one pod's scrape, one action, one Event; an action's ledger
entry is kept in memory the moment it is decided, before anything else can fail, and stays there
until a status write carries it, so cooldown and the breaker never under-count.
"""

from __future__ import annotations

import base64
import binascii
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pdwarden import metrics
from pdwarden.api import LedgerEntry, PDDeploymentSpec, PDDeploymentStatus, RemediationStatus
from pdwarden.api.status import MAX_HISTORY
from pdwarden.constants import (
    ANNOTATION_RESET_BREAKER,
    CONDITION_SERVING,
    LABEL_ROLE,
    ROLE_PREFILL,
    WORKER_PORT,
)
from pdwarden.ownership import Workloads, owned_chain, selector
from pdwarden.ports import KubeApi, WorkerApi
from pdwarden.remediation.act.sglang import PrefillAborter, SGLangAdmin
from pdwarden.remediation.common import (
    announce_new_wedges,
    execute,
    iso,
    now_utc,
    report_action,
    scrape_all,
    why,
)
from pdwarden.remediation.detect.rules import Detection, detect
from pdwarden.remediation.policy.plan import Action, Plan, plan
from pdwarden.remediation.record.ledger import (
    breaker_reset_at,
    cycle_status,
    ledger_entry,
    merge_history,
    missing_from,
)
from pdwarden.remediation.scrape.client import Target
from pdwarden.remediation.views import (
    WORKER_ROLES,
    DeploymentMemory,
    WorkerPod,
    decode_pods,
    pod_views,
    remember,
    scrape_targets,
    stale_pods,
)
from pdwarden.render import Owner, names
from pdwarden.tokens import derive_token

log = logging.getLogger("pdwarden.remediation.cycle")
CORDON_REASON = "Cordoned"


@dataclass
class CycleResult:
    detection: Detection
    plan: Plan
    ledger: list[LedgerEntry]  # this cycle's entries
    status: PDDeploymentStatus
    clear_reset_annotation: bool = False  # remove it once the status (with the reset) is written


@dataclass(frozen=True)
class _Cycle:
    """What the acting half of one cycle works with."""

    body: Mapping[str, Any]
    owner: Owner
    mem: DeploymentMemory
    token: str | None
    now: datetime


def _target(w: WorkerPod) -> Target:
    return Target(
        pod=w.name, uid=w.uid, role=w.role, ip=w.ip, port=WORKER_PORT, rooms=w.rooms,
        engine=w.engine,
    )  # fmt: skip


_now = now_utc
_iso = iso
_why = why


class Remediator:
    """Runs cycles for every PDDeployment of one operator process."""

    def __init__(
        self,
        client: KubeApi,
        workers: WorkerApi,
        token_key: bytes | None = None,
        sglang: PrefillAborter | None = None,
    ) -> None:
        self.client = client
        self.workers = workers
        self.sglang = sglang or SGLangAdmin()
        self.token_key = token_key
        self.memory: dict[str, DeploymentMemory] = {}

    def forget(self, uid: str) -> None:
        self.memory.pop(uid, None)

    def recorded(self, uid: str, status: PDDeploymentStatus) -> None:
        """A status write succeeded: entries it holds no longer need carrying."""
        mem = self.memory.get(uid)
        if mem is not None:
            history = (status.remediation or RemediationStatus()).history
            mem.unrecorded = missing_from(history, mem.unrecorded)[-MAX_HISTORY:]

    async def admin_token(self, owner: Owner) -> str | None:
        if self.token_key is not None:
            return derive_token(self.token_key, owner.namespace, owner.name, owner.uid)
        secret = await self.client.get(
            "v1", "Secret", owner.namespace, names(owner.name).admin_secret
        )
        data = (secret or {}).get("data") or {}
        try:
            return base64.b64decode(data["token"]).decode() if "token" in data else None
        except (binascii.Error, UnicodeDecodeError, TypeError):
            return None

    async def our_pods(self, owner: Owner) -> list[dict[str, Any]]:
        """Worker pods whose owner chain leads to this PDDeployment; look-alikes carrying our
        labels are never scraped with the token, judged or acted on (and reported once)."""
        sel = selector(owner.name)
        sets = await self.client.list("apps/v1", "StatefulSet", owner.namespace, sel)
        pods = await self.client.list("v1", "Pod", owner.namespace, sel)
        workloads = Workloads.of(sets, (), owner.uid)
        mine, foreign = [], set()
        for p in pods:
            meta = p.get("metadata") or {}
            if (meta.get("labels") or {}).get(LABEL_ROLE) not in WORKER_ROLES:
                continue  # the router: never scraped, never acted on
            if owned_chain(p, workloads):
                mine.append(p)
            elif not meta.get("deletionTimestamp"):
                foreign.add(str(meta.get("name")))
        mem = self.memory.setdefault(owner.uid, DeploymentMemory())
        if foreign - mem.foreign:
            log.warning(
                "%s/%s: ignoring pod(s) with our labels but not our owner chain: %s",
                owner.namespace, owner.name, ", ".join(sorted(foreign - mem.foreign)),
            )  # fmt: skip
        mem.foreign = foreign
        return mine

    async def cycle(
        self, body: Mapping[str, Any], spec: PDDeploymentSpec, previous: PDDeploymentStatus
    ) -> CycleResult:
        started = time.monotonic()
        meta = body["metadata"]
        owner = Owner(meta["name"], meta["namespace"], meta["uid"])
        rem, now = spec.remediation, _now()
        mem = self.memory.setdefault(owner.uid, DeploymentMemory())
        pods = await self.our_pods(owner)
        workers = scrape_targets(pods, spec.engine)
        token = await self.admin_token(owner) if any(w.rooms for w in workers) else None
        observations = await scrape_all(
            self.workers, workers, {w.uid: _target(w) for w in workers}, token
        )
        interval = rem.scrape_interval_seconds
        remember(mem, list(observations.values()), rem.wedge_after_seconds + 3 * interval)
        views = pod_views(workers, observations, mem, time.monotonic(), interval)
        detection = detect(views, rem.wedge_after_seconds)
        stale = stale_pods(pods, views)
        decodes = decode_pods(pods, stale, now)
        annotations = meta.get("annotations") or {}
        reset_at = breaker_reset_at(annotations, meta.get("generation"), previous, now)
        history = merge_history(
            (previous.remediation or RemediationStatus()).history, mem.unrecorded
        )
        decision = plan(
            rem, detection, decodes, history, now,
            decode_replicas=spec.decode.replicas, breaker_reset_at=reset_at,
            engine=spec.engine, prefills=decode_pods(pods, stale, now, role=ROLE_PREFILL),
        )  # fmt: skip
        await announce_new_wedges(self.client, body, mem, detection, now)
        ctx = _Cycle(body, owner, mem, token, now)
        ledger = await self._execute(ctx, decision, workers)
        status = cycle_status(
            previous=previous, policy=rem, generation=meta.get("generation"),
            detection=detection, decision=decision, history=merge_history(history, ledger),
            decodes=decodes, now=now, reset_at=reset_at,
        )  # fmt: skip
        metrics.SCRAPE_CYCLE_SECONDS.observe(time.monotonic() - started)
        clear = reset_at == now and ANNOTATION_RESET_BREAKER in annotations
        return CycleResult(detection, decision, ledger, status, clear)

    async def _execute(
        self, ctx: _Cycle, decision: Plan, workers: list[WorkerPod]
    ) -> list[LedgerEntry]:
        by_pod = {w.name: _target(w) for w in workers}

        async def act(action: Action) -> LedgerEntry:
            return await self._act(ctx, action, by_pod.get(action.pod), decision.dry_run)

        done = await execute(ctx.mem, decision, ctx.now, act)
        for action, entry in done:
            await report_action(self.client, ctx.body, action, entry, decision.dry_run)
        return [entry for _, entry in done]

    async def _act(
        self, ctx: _Cycle, action: Action, target: Target | None, dry_run: bool
    ) -> LedgerEntry:
        """Perform one action (unless DryRun); never raises, the outcome says what happened."""
        now = ctx.now
        if dry_run:
            metrics.REMEDIATIONS.labels(action.kind, "dry_run").inc()
            return ledger_entry(action, now=now, dry_run=True, outcome="Succeeded")
        try:
            detail, done = await self._perform(ctx.owner, action, target, ctx.token, now)
        except Exception as e:  # contained per action: recorded as Failed, the cycle goes on
            metrics.REMEDIATIONS.labels(action.kind, "failed").inc()
            metrics.ERRORS.labels("action").inc()
            return ledger_entry(action, now=now, dry_run=False, outcome="Failed", detail=_why(e))
        skipped = detail.startswith("skipped")
        metrics.REMEDIATIONS.labels(action.kind, "skipped" if skipped else "succeeded").inc()
        return ledger_entry(
            action, now=now, dry_run=False, outcome="Skipped" if skipped else "Succeeded",
            detail=detail, rooms=done,
        )  # fmt: skip

    async def _perform(
        self, owner: Owner, action: Action, target: Target | None, token: str | None, now: datetime
    ) -> tuple[str, int | None]:
        """Carry out one action; returns a detail for the ledger and, for FailRooms, how many
        rooms the worker really failed (rooms that finished meanwhile are not counted), for
        AbortRequests how many requests the SGLang prefill held when all were aborted."""
        ns = owner.namespace
        if action.kind == "FailRooms":
            if target is None or not target.rooms:
                return "skipped: this engine has no admin API to fail rooms by id", 0
            failed = await self.workers.fail_rooms(target, action.rooms, token)
            failed = max(0, min(int(failed), len(action.rooms)))
            return f"worker failed {failed} of {len(action.rooms)} rooms", failed
        if action.kind in ("CordonDecode", "UncordonDecode"):
            cordon = action.kind == "CordonDecode"
            await self.client.set_pod_condition(
                ns, action.pod,
                {"type": CONDITION_SERVING, "status": "False" if cordon else "True",
                 "reason": CORDON_REASON if cordon else "Uncordoned",
                 "message": f"pdwarden: {action.reason}", "lastTransitionTime": _iso(now)},
            )  # fmt: skip
            return "", None
        if action.kind in ("RestartDecode", "RestartPrefill"):
            deleted = await self.client.delete_pod(ns, action.pod, action.uid)
            return ("" if deleted else "skipped: the pod was already gone or replaced"), None
        if action.kind == "AbortRequests":
            if target is None:
                return "skipped: the prefill pod has no address (not running)", 0
            report = await self.sglang.abort_all(target.base)
            return report.detail(f"{action.pod} ({target.base})"), report.aborted
        raise ValueError(f"unknown action {action.kind}")
