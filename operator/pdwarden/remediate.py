"""One scrape-detect-remediate cycle for a PDDeployment: the imperative shell of remediation.

Why: detection and policy are pure; this module gathers their inputs (pods from the API server,
samples from the workers), carries out the plan (admin API, pod conditions, pod deletes), and
makes every decision visible: Events on the PDDeployment and the pod, the bounded ledger in
status, and metrics. The ledger is written after each cycle that acted, and cordons live on the
pods themselves, so a restarted operator picks the ladder up where it was.
"""

from __future__ import annotations

import base64
import logging
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from pdwarden import metrics
from pdwarden.api import (
    CordonRecord,
    LedgerEntry,
    PDDeploymentSpec,
    PDDeploymentStatus,
    RemediationStatus,
    WedgeFinding,
)
from pdwarden.api.status import MAX_CORDONED, MAX_HISTORY, MAX_WEDGES
from pdwarden.conditions import condition_is, phase_of, set_condition
from pdwarden.constants import (
    ANNOTATION_RESET_BREAKER,
    CONDITION_SERVING,
    LABEL_ROLE,
    ROLE_DECODE,
    ROLE_PREFILL,
)
from pdwarden.detection import Detection, Finding, PodView, detect
from pdwarden.k8s import ApiError, KubeClient
from pdwarden.k8s.events import post_event
from pdwarden.remediation import Action, DecodePod, Plan, actions_in_last_hour, plan
from pdwarden.render import Owner, names
from pdwarden.samples import Sample, ScrapeError
from pdwarden.scraping import ScrapeResult, Target, WorkerClient
from pdwarden.sglang_admin import PrefillAborter, SGLangAdmin
from pdwarden.tokens import derive_token

log = logging.getLogger("pdwarden.remediate")
Obj = dict[str, Any]
CORDON_REASON = "Cordoned"
WORKER_PORT = 8000
STALE_AFTER_INTERVALS = 2.5


@dataclass
class PodMemory:
    samples: deque[Sample] = field(default_factory=deque)
    last_error: str | None = None
    last_ok: float = 0.0


@dataclass
class DeploymentMemory:
    """What one operator process remembers between cycles (lost on restart, by design)."""

    pods: dict[str, PodMemory] = field(default_factory=dict)  # by pod uid
    first_seen: dict[tuple[str, str, str], datetime] = field(default_factory=dict)


@dataclass
class CycleResult:
    detection: Detection
    plan: Plan
    ledger: list[LedgerEntry]
    status: PDDeploymentStatus


def _now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


def _iso(t: datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


def _condition(pod: Obj, type_: str) -> Obj | None:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return dict(c)
    return None


def _decode_pod(pod: Obj, stale: bool) -> DecodePod:
    meta = pod["metadata"]
    serving = _condition(pod, CONDITION_SERVING)
    since = None
    if serving and serving.get("status") == "False":
        raw = serving.get("lastTransitionTime")
        since = datetime.fromisoformat(raw.replace("Z", "+00:00")) if raw else _now()
    ready = (_condition(pod, "Ready") or {}).get("status") == "True"
    return DecodePod(
        name=meta["name"],
        uid=meta["uid"],
        ready=ready,
        cordoned_since=since,
        terminating=bool(meta.get("deletionTimestamp")),
        stale=stale,
    )


def _prefill_pods(pods: list[Obj], stale: set[str]) -> list[DecodePod]:
    return [
        _decode_pod(p, p["metadata"]["name"] in stale)
        for p in pods
        if (p["metadata"].get("labels") or {}).get(LABEL_ROLE) == ROLE_PREFILL
    ]


def _targets(pods: list[Obj], engine: str) -> list[Target]:
    out = []
    for pod in pods:
        meta, st = pod["metadata"], pod.get("status") or {}
        role = (meta.get("labels") or {}).get(LABEL_ROLE)
        if role not in (ROLE_PREFILL, ROLE_DECODE) or not st.get("podIP"):
            continue
        if meta.get("deletionTimestamp") or st.get("phase") != "Running":
            continue
        out.append(
            Target(
                pod=meta["name"], uid=meta["uid"], role=role, ip=st["podIP"], port=WORKER_PORT,
                rooms=(engine == "pdworker" and role == ROLE_PREFILL),
            )
        )  # fmt: skip
    return out


class Remediator:
    """Runs cycles for every PDDeployment of one operator process."""

    def __init__(
        self,
        client: KubeClient,
        workers: WorkerClient,
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

    async def admin_token(self, owner: Owner) -> str | None:
        if self.token_key is not None:
            return derive_token(self.token_key, owner.namespace, owner.name, owner.uid)
        secret = await self.client.get(
            "v1", "Secret", owner.namespace, names(owner.name).admin_secret
        )
        data = (secret or {}).get("data") or {}
        return base64.b64decode(data["token"]).decode() if "token" in data else None

    def _remember(
        self, mem: DeploymentMemory, results: list[ScrapeResult], keep_seconds: float
    ) -> None:
        alive = {r.target.uid for r in results}
        for uid in list(mem.pods):
            if uid not in alive:
                del mem.pods[uid]
        for r in results:
            pm = mem.pods.setdefault(r.target.uid, PodMemory())
            if r.sample is None:
                pm.last_error = r.error
                continue
            pm.last_error = None
            pm.last_ok = r.sample.at
            pm.samples.append(r.sample)
            while pm.samples and r.sample.at - pm.samples[0].at > keep_seconds:
                pm.samples.popleft()

    async def cycle(
        self,
        body: Mapping[str, Any],
        spec: PDDeploymentSpec,
        previous: PDDeploymentStatus,
    ) -> CycleResult:
        started = time.monotonic()
        meta = body["metadata"]
        owner = Owner(meta["name"], meta["namespace"], meta["uid"])
        rem = spec.remediation
        now = _now()
        mem = self.memory.setdefault(owner.uid, DeploymentMemory())
        pods = await self.client.list(
            "v1", "Pod", owner.namespace, f"pdwarden.dev/deployment={owner.name}"
        )
        targets = _targets(pods, spec.engine)
        token = await self.admin_token(owner) if any(t.rooms for t in targets) else None
        results = await self.workers.scrape(targets, token)
        metrics.SCRAPES.inc(len(results))
        errors = [r for r in results if r.sample is None]
        metrics.SCRAPE_ERRORS.inc(len(errors))
        interval = rem.scrape_interval_seconds
        self._remember(mem, results, keep_seconds=rem.wedge_after_seconds + 3 * interval)
        mono = time.monotonic()
        views = []
        stale_names = set()
        for t in targets:
            pm = mem.pods.get(t.uid, PodMemory())
            stale = (
                pm.last_error is not None or mono - pm.last_ok > STALE_AFTER_INTERVALS * interval
            )
            if stale:
                stale_names.add(t.pod)
            result = next(r for r in results if r.target.uid == t.uid)
            views.append(
                PodView(
                    name=t.pod, role=t.role, uid=t.uid, history=tuple(pm.samples),
                    rooms=result.rooms, stale=stale, error=pm.last_error,
                )
            )  # fmt: skip
        # Pods that exist but are not scrapeable (no IP yet, not running) count as unknown too.
        scraped = {t.pod for t in targets}
        for pod in pods:
            name = pod["metadata"]["name"]
            role = (pod["metadata"].get("labels") or {}).get(LABEL_ROLE)
            if role in (ROLE_PREFILL, ROLE_DECODE) and name not in scraped:
                stale_names.add(name)
        detection = detect(views, rem.wedge_after_seconds)
        decodes = [
            _decode_pod(p, p["metadata"]["name"] in stale_names)
            for p in pods
            if (p["metadata"].get("labels") or {}).get(LABEL_ROLE) == ROLE_DECODE
        ]
        remediation = previous.remediation or RemediationStatus()
        reset_at = self._breaker_reset(body, previous, remediation, now)
        decision = plan(
            rem, detection, decodes, remediation.history, now,
            decode_replicas=spec.decode.replicas, breaker_reset_at=reset_at,
            engine=spec.engine, prefills=_prefill_pods(pods, stale_names),
        )  # fmt: skip
        await self._announce_new_wedges(body, mem, detection, now)
        ledger = await self._execute(
            body=body, owner=owner, decision=decision, targets=targets, token=token, now=now
        )
        status = self._status(
            body=body, spec=spec, previous=previous, detection=detection, decision=decision,
            ledger=ledger, decodes=decodes, now=now, reset_at=reset_at,
        )  # fmt: skip
        if reset_at and ANNOTATION_RESET_BREAKER in (meta.get("annotations") or {}):
            await self.client.patch_metadata(
                body["apiVersion"], body["kind"], owner.namespace, owner.name,
                {"annotations": {ANNOTATION_RESET_BREAKER: None}},
            )  # fmt: skip
        metrics.SCRAPE_CYCLE_SECONDS.observe(time.monotonic() - started)
        return CycleResult(detection, decision, ledger, status)

    def _breaker_reset(
        self,
        body: Mapping[str, Any],
        previous: PDDeploymentStatus,
        remediation: RemediationStatus,
        now: datetime,
    ) -> datetime | None:
        """The breaker resets on the reset annotation, or when the spec changed since it tripped."""
        annotations = body["metadata"].get("annotations") or {}
        if ANNOTATION_RESET_BREAKER in annotations:
            return now
        tripped = next((c for c in previous.conditions if c.type == "RemediationSuspended"), None)
        generation = body["metadata"].get("generation")
        if (
            tripped is not None
            and tripped.status == "True"
            and tripped.observed_generation is not None
            and tripped.observed_generation != generation
        ):
            return now
        return remediation.breaker_reset_at

    async def _execute(
        self,
        *,
        body: Mapping[str, Any],
        owner: Owner,
        decision: Plan,
        targets: list[Target],
        token: str | None,
        now: datetime,
    ) -> list[LedgerEntry]:
        entries = []
        by_pod = {t.pod: t for t in targets}
        for action in decision.actions:
            outcome: Literal["Succeeded", "Failed", "Skipped"] = "Succeeded"
            detail, rooms = "", action.room_count
            if decision.dry_run:
                result = "dry_run"
            else:
                try:
                    detail, done = await self._perform(
                        owner, action, by_pod.get(action.pod), token, now
                    )
                    rooms = done if done is not None else rooms
                    result = "skipped" if detail.startswith("skipped") else "succeeded"
                    outcome = "Skipped" if result == "skipped" else "Succeeded"
                except (ApiError, ScrapeError, OSError, TimeoutError) as e:
                    outcome, result, detail = "Failed", "failed", str(e)
            metrics.REMEDIATIONS.labels(action.kind, result).inc()
            reason = action.reason + (f"; {detail}" if detail else "")
            entry = LedgerEntry(
                time=now, action=action.kind, pod=action.pod, peer=action.peer,
                rooms=rooms, reason=reason[:1024],
                dry_run=decision.dry_run, outcome=outcome,
            )  # fmt: skip
            entries.append(entry)
            verb = f"DryRun{action.kind}" if decision.dry_run else action.kind
            message = (
                f"{'would ' if decision.dry_run else ''}{action.kind} {action.pod}: {entry.reason}"
            )
            kind: Literal["Normal", "Warning"] = "Warning" if outcome == "Failed" else "Normal"
            await post_event(self.client, dict(body), verb, message, kind)
            pod_ref = {"apiVersion": "v1", "kind": "Pod",
                       "metadata": {"name": action.pod, "namespace": owner.namespace,
                                    "uid": action.uid or None}}  # fmt: skip
            await post_event(self.client, pod_ref, verb, message, kind)
            log.info("%s/%s: %s", owner.namespace, owner.name, message)
        return entries

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

    async def _announce_new_wedges(
        self, body: Mapping[str, Any], mem: DeploymentMemory, detection: Detection, now: datetime
    ) -> None:
        current = {(f.pod, f.reason, f.peer or ""): f for f in detection.findings}
        for key in list(mem.first_seen):
            if key not in current:
                del mem.first_seen[key]
        for key, f in current.items():
            if key in mem.first_seen:
                continue
            mem.first_seen[key] = now
            metrics.WEDGES_DETECTED.labels(f.reason).inc()
            if f.reason in ("InflightStuck", "PeerIncarnationGone"):
                metrics.TIME_TO_REMEDIATE.observe(f.oldest_seconds)
            await post_event(
                self.client, dict(body), "WedgeDetected", f"{f.reason} on {f.pod}: {f.evidence}",
                "Warning",
            )  # fmt: skip

    def _status(
        self,
        *,
        body: Mapping[str, Any],
        spec: PDDeploymentSpec,
        previous: PDDeploymentStatus,
        detection: Detection,
        decision: Plan,
        ledger: list[LedgerEntry],
        decodes: list[DecodePod],
        now: datetime,
        reset_at: datetime | None,
    ) -> PDDeploymentStatus:
        generation = body["metadata"].get("generation")
        old = previous.remediation or RemediationStatus()
        history = [*old.history, *ledger][-MAX_HISTORY:]
        cordoned = [
            CordonRecord(pod=d.name, since=d.cordoned_since)
            for d in decodes
            if d.cordoned_since is not None
        ][:MAX_CORDONED]
        used = actions_in_last_hour(history, now, decision.dry_run, reset_at)
        suspended = used >= spec.remediation.max_actions_per_hour
        remediation = RemediationStatus(
            history=history, cordoned=cordoned, actions_last_hour=used, suspended=suspended,
            decode_budget=decision.budget, breaker_reset_at=reset_at,
        )  # fmt: skip
        meta = body["metadata"]
        metrics.REMEDIATION_SUSPENDED.labels(meta["namespace"], meta["name"]).set(int(suspended))
        metrics.WEDGED_ROOMS.labels(meta["namespace"], meta["name"]).set(detection.wedged_rooms)
        wedges = [_wedge(f, now) for f in detection.findings][:MAX_WEDGES]
        conditions = list(previous.conditions)
        if detection.findings:
            wedged, reason = True, "WedgesFound"
            message = "; ".join(f"{f.reason} on {f.pod}: {f.evidence}" for f in detection.findings)
        elif detection.unknown:
            wedged, reason = None, "MetricsUnavailable"
            message = "cannot judge (no action is taken on these pods): " + "; ".join(
                detection.unknown
            )
        else:
            wedged, reason, message = False, "NoWedges", "every worker's queues are moving"
        conditions = set_condition(
            conditions, "Wedged", status=wedged, reason=reason, message=message[:4000],
            now=now, generation=generation,
        )  # fmt: skip
        held = "; ".join(decision.held_back)
        conditions = set_condition(
            conditions, "RemediationSuspended", status=suspended,
            reason="CircuitBreakerOpen" if suspended else "WithinBudget",
            message=(
                f"{used} actions in the last hour reached maxActionsPerHour "
                f"{spec.remediation.max_actions_per_hour}; reset with the annotation "
                f"{ANNOTATION_RESET_BREAKER} or by changing the spec"
                if suspended
                else f"{used} of {spec.remediation.max_actions_per_hour} actions used this hour"
            ) + (f". Held back: {held}" if held else ""),
            now=now, generation=generation,
        )  # fmt: skip
        if suspended and condition_is(previous.conditions, "RemediationSuspended"):
            # Keep the generation it tripped at, so a spec change is what resets it.
            old_cond = next(c for c in previous.conditions if c.type == "RemediationSuspended")
            conditions = [
                c.model_copy(update={"observed_generation": old_cond.observed_generation})
                if c.type == "RemediationSuspended" else c
                for c in conditions
            ]  # fmt: skip
        return previous.model_copy(
            update={
                "conditions": conditions,
                "wedges": wedges,
                "wedged_rooms": detection.wedged_rooms,
                "remediation": remediation,
                "phase": phase_of(conditions, invalid=previous.phase == "Failed"),
            }
        )


def _wedge(f: Finding, now: datetime) -> WedgeFinding:
    return WedgeFinding(
        pod=f.pod, role=f.role, reason=f.reason, rooms=f.room_count,
        oldest_seconds=round(f.oldest_seconds, 1), peer=f.peer, since=now,
    )  # fmt: skip
