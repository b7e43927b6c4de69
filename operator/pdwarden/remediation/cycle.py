"""The one remediation cycle: observe -> scrape -> detect -> confirm -> plan -> act -> record,
for every kind (and, beside it, the configuration advisor: warnings that change nothing).

Why one: a PDDeployment (pods pdwarden runs) and a PDRemediationPolicy (pods someone else runs)
differ only in which pods they cover, how a cordon and a restart land, what a cordon needs to be
admitted and where their status goes. Those differences are a `Kind` (remediation.kinds); the
pipeline, its containment and its record-keeping exist once, here, so a fix reaches both kinds.

Intent before action (issue 28): before an action touches anything, its ledger entry is written
to the object's status as Pending through the `Journal` (one API call per action); after it, the
completed entry replaces it in the status this cycle writes. A replica that dies anywhere in
between leaves either nothing or a Pending entry that the next cycle of any replica completes
from what the pods show (`recovery.settle`), posting the action's Event if it is missing: Events
are named after the entry, so a second post is refused by the API server, never duplicated.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Generic, Literal

from pdwarden import metrics
from pdwarden.api import LedgerEntry, PDDeploymentStatus
from pdwarden.constants import ANNOTATION_RESET_BREAKER
from pdwarden.remediation import observing, recovery
from pdwarden.remediation.act import worker_admin
from pdwarden.remediation.act.done import Done, skipped
from pdwarden.remediation.confirmation import confirm, confirm_pairs
from pdwarden.remediation.decide import Plan, PlannedAction, plan
from pdwarden.remediation.detect.advisories import advise
from pdwarden.remediation.detect.rules import Detection, detect
from pdwarden.remediation.events import (
    announce_advisories,
    announce_new_wedges,
    announce_refused,
    report_entry,
)
from pdwarden.remediation.memory import (
    DeploymentMemory,
    pod_views,
    remember,
)
from pdwarden.remediation.node_lost import lost_pods
from pdwarden.remediation.record.ledger import (
    breaker_reset_at,
    held_tally,
    ledger_entry,
    merge_history,
    new_entry_id,
)
from pdwarden.remediation.scrape import sanitize
from pdwarden.remediation.seams import (
    Journal,
    Kind,
    Round,
    SeenT,
    SpecT,
    StatusT,
    Tools,
    now_utc,
)
from pdwarden.values import CanaryCost

log = logging.getLogger("pdwarden.remediation.cycle")
# A test switch, like pdworker's --fault: SIGKILL this process at one point of an action
# ("intent", "action" or "event"; optionally ":<ActionKind>"), so a failover test can kill the
# active replica exactly there (e2e/tests/test_ledger_failover.py). Unset in production.
KILL_AT_ENV = "PDWARDEN_FAULT_KILL_AT"
KillPoint = Literal["intent", "action", "event"]
Obj = Mapping[str, Any]
# An action starts only on evidence at most this many scrape intervals old (never less than
# EVIDENCE_FLOOR seconds): a cycle whose writes the API server answered late (etcd stalled, the
# API server overloaded) must not carry out, many seconds on, a decision about pods that may
# have changed since it looked; the next cycle looks again.
EVIDENCE_INTERVALS = 2
EVIDENCE_FLOOR = 5.0
# Prometheus mode: a pod whose last scrape by Prometheus is older than this many scrape
# intervals cannot be judged from the screen (a lagging Prometheus). With Prometheus scraping
# every interval and an answer reused for one (`scrape.prometheus.REUSE`), a screened sample is
# at most ~2 intervals old: inside memory's 2.5 (`memory.STALE_AFTER_INTERVALS`).
SCREEN_INTERVALS = 3


def evidence_limit(interval: float) -> float:
    return max(EVIDENCE_INTERVALS * interval, EVIDENCE_FLOOR)


@dataclass
class CycleResult(Generic[StatusT]):
    detection: Detection
    plan: Plan
    ledger: list[LedgerEntry]  # this cycle's entries (settled ones included)
    status: StatusT
    clear_reset_annotation: bool = False  # remove it once the status (with the reset) is written


def history_of(status: PDDeploymentStatus) -> list[LedgerEntry]:
    return list(status.remediation.history) if status.remediation else []


async def run(
    kind: Kind[SpecT, StatusT, SeenT],
    tools: Tools,
    body: Obj,
    spec: SpecT,
    previous: StatusT,
    *,
    mem: DeploymentMemory,
    journal: Journal,
) -> CycleResult[StatusT]:
    """One cycle of one object; the caller holds its lock and writes the returned status."""
    started = time.monotonic()
    meta = body["metadata"]
    rem = spec.remediation
    seen = await kind.observe(body, spec, mem)
    r = Round(kind, tools, spec, seen, body, now_utc(), mem, journal)
    # Read from the pods' own settings; reported (a condition, Events), never planned on.
    advisories = advise(seen.advised(), spec.engine)
    await announce_advisories(tools.client, body, mem, advisories)
    lost = lost_pods(seen.pods, r.now)  # unknown, whatever they answer (node_lost.py)
    interval = rem.scrape_interval_seconds
    observed = await observing.observe(tools, seen, lost, mem, SCREEN_INTERVALS * interval)
    observations = observed.observations
    evidence_at = time.monotonic()
    keep = rem.wedge_after_seconds + 3 * interval
    remember(mem, list(observations.values()), keep)
    await announce_refused(tools.client, body, mem, seen.workers, observations)
    views = pod_views(seen.workers, observations, mem, time.monotonic(), interval)
    detection = detect(views, rem.wedge_after_seconds)
    if observed.screened:  # prometheus mode: what detection found is read again, directly
        checked = await observing.verify(
            tools, seen, observed, detection, mem, lost=lost, keep_seconds=keep,
            interval=interval, wedge_after=rem.wedge_after_seconds,
        )  # fmt: skip
        if checked is not None:
            detection, views = checked
            evidence_at = time.monotonic()
    stale = {v.name for v in views if v.stale} | set(seen.unjudged) | set(lost)
    shared = kind.shared_status(previous)
    history = merge_history(history_of(shared), mem.unrecorded)
    settled = await recovery.settle(r, history)
    reconstructed = kind.reconstruct(seen, history, r.now) if mem.cycles == 0 else []
    mem.cycles += 1  # (the first cycle of the object in this process: a takeover, or a start)
    # This cycle's pods were read before the settling: plan sees the settled intents as still
    # Pending and leaves their pods to the next cycle, which reads what the settling did.
    plan_history = merge_history(history, reconstructed)
    settled += reconstructed
    for entry in settled:
        mem.unrecorded.append(entry)
        if entry.outcome != "Skipped":  # an intent that never ran happened to nobody: no Event
            await report_entry(tools.client, body, entry)
    history = merge_history(history, settled)
    annotations = meta.get("annotations") or {}
    reset_at = breaker_reset_at(annotations, meta.get("generation"), shared, r.now)
    decodes, prefills = kind.serving(spec, seen, stale, history, r.now)
    confirming = time.monotonic()
    detection = await confirm_pairs(r, detection, views)  # first: what it judged is not re-asked
    detection = await confirm(r, detection, decodes, plan_history)
    evidence_at += time.monotonic() - confirming  # a canary gathers evidence; it does not age it
    decision = plan(
        rem, detection, decodes, plan_history, r.now,
        decode_replicas=seen.decode_replicas, breaker_reset_at=reset_at,
        engine=spec.engine, prefills=prefills,
    )  # fmt: skip
    decision = kind.admit(decision, seen)
    await announce_new_wedges(tools.client, body, mem, detection, r.now)
    done = await execute(r, decision, evidence_at=evidence_at)
    cost = mem.canary_cost + detection.canary_cost  # what the status has not carried yet
    status = kind.status(
        previous, spec, seen, detection=replace(detection, canary_cost=cost), decision=decision,
        history=merge_history(history, done), decodes=decodes, done=done, now=r.now,
        reset_at=reset_at, generation=meta.get("generation"), advisories=advisories,
    )  # fmt: skip
    status, carried = held_tally(status, previous, r.now)
    mem.canary_cost = CanaryCost() if carried else cost
    metrics.SCRAPE_CYCLE_SECONDS.observe(time.monotonic() - started)
    labels = (kind.name, meta["namespace"], meta["name"])
    metrics.REMEDIATION_SUSPENDED.labels(*labels).set(int(decision.suspended))
    metrics.WEDGED_ROOMS.labels(*labels).set(detection.wedged_rooms)
    clear = reset_at == r.now and ANNOTATION_RESET_BREAKER in annotations
    return CycleResult(detection, decision, settled + done, status, clear)


async def execute(
    r: Round[Any, Any, Any], decision: Plan, *, evidence_at: float | None = None
) -> list[LedgerEntry]:
    """Each planned action: its intent on the API server, the action, its entry, its Event.

    An intent that cannot be written stops that action before it starts (intent before action,
    always); DryRun touches nothing and writes no intent. Evidence (gathered at the monotonic
    `evidence_at`) older than `evidence_limit` stops an action too: before its intent nothing is
    recorded; after it (the intent's write was answered late) the entry is completed Skipped,
    without an Event, since nothing happened to anybody.
    """
    limit = (
        math.inf
        if evidence_at is None
        else evidence_limit(r.spec.remediation.scrape_interval_seconds)
    )

    def age() -> float:
        return 0.0 if evidence_at is None else time.monotonic() - evidence_at

    out = []
    for action in decision.actions:
        if age() > limit:
            metrics.REMEDIATIONS.labels(action.kind, "skipped").inc()
            log.warning("%s: %s %s not taken: its evidence is %.0fs old (limit %.0fs)",
                        r.seen.namespace, action.kind, action.pod, age(), limit)  # fmt: skip
            continue
        entry_id = new_entry_id()
        if not decision.dry_run:
            intent = ledger_entry(
                action, now=r.now, dry_run=False, outcome="Pending", entry_id=entry_id
            )
            try:
                await r.journal.intend(intent)
            except Exception as e:  # the API server refused or is down: do not act
                metrics.ERRORS.labels("intent").inc()
                log.warning("%s: %s %s not taken, its intent could not be recorded: %s",
                            r.seen.namespace, action.kind, action.pod, sanitize.why(e))  # fmt: skip
                continue
            r.mem.unrecorded.append(intent)
            _kill_point("intent", action.kind)
        late = age() > limit  # the intent's write took that long
        if late:
            metrics.REMEDIATIONS.labels(action.kind, "skipped").inc()
            done = skipped(
                f"its evidence was {age():.0f}s old once its intent was recorded (limit "
                f"{limit:.0f}s: the API server answered late); the next cycle looks again"
            )
        else:
            done = await perform(r, action, decision.dry_run)
        entry = ledger_entry(
            action, now=r.now, dry_run=decision.dry_run, outcome=done.outcome,
            detail=done.detail, rooms=done.rooms, entry_id=entry_id,
        )  # fmt: skip
        r.mem.unrecorded.append(entry)
        if done.outcome == "Succeeded" and not decision.dry_run:
            observe_time_to_remediate(r.mem, action, r.now)
        if done.held is not None:
            r.seen.held.append(done.held)
        _kill_point("action", action.kind)
        if not late:
            await report_entry(r.tools.client, r.body, entry)
        _kill_point("event", action.kind)
        out.append(entry)
    return out


def observe_time_to_remediate(mem: DeploymentMemory, action: PlannedAction, now: datetime) -> None:
    """How long after its wedge was first found a repairing action landed (uncordoning is no
    repair). The wedge is the earliest finding still held on the pod or naming it as the peer."""
    if action.kind == "UncordonDecode":
        return
    pods = {action.pod, action.peer} - {None}
    found = [at for (pod, _, peer), at in mem.first_seen.items() if pod in pods or peer in pods]
    if found:
        metrics.TIME_TO_REMEDIATE.observe(max(0.0, (now - min(found)).total_seconds()))


async def perform(r: Round[Any, Any, Any], action: PlannedAction, dry_run: bool) -> Done:
    """One action (unless DryRun); never raises, the outcome says what happened."""
    if dry_run:
        metrics.REMEDIATIONS.labels(action.kind, "dry_run").inc()
        return Done()
    try:
        done = await _dispatch(r, action)
    except Exception as e:  # contained per action: recorded as Failed, the cycle goes on
        metrics.REMEDIATIONS.labels(action.kind, "failed").inc()
        metrics.ERRORS.labels("action").inc()
        return Done("Failed", sanitize.why(e))
    metrics.REMEDIATIONS.labels(action.kind, done.outcome.lower()).inc()
    return done


async def _dispatch(r: Round[Any, Any, Any], action: PlannedAction) -> Done:
    seen, tools = r.seen, r.tools
    if action.kind == "FailRooms":
        target = seen.target(action.pod)
        if target is None or not target.rooms:
            return skipped("this engine has no admin API to fail rooms by id", 0)
        failed = await worker_admin.fail_rooms(
            tools.admin, target, action.rooms, seen.token, seen.fallback_token
        )
        failed = max(0, min(int(failed), len(action.rooms)))
        return Done(detail=f"worker failed {failed} of {len(action.rooms)} rooms", rooms=failed)
    if action.kind == "AbortRequests":
        target = seen.target(action.pod)
        if target is None:
            return skipped("the prefill pod has no address (not running)", 0)
        key = await r.kind.sglang_key(r.spec, seen)
        report = await tools.sglang.abort_all(target, key, seen.tenant)
        # abort_all is the narrowest call SGLang 0.5.23 offers (act/sglang_abort.py says why), so
        # the entry and its Event say what it cost: every request the prefill held, and how many of
        # those were healthy given the rooms the finding counted wedged.
        detail = report.detail(f"{action.pod} ({target.base})", wedged=action.room_count)
        return Done(detail=detail, rooms=report.aborted)
    if action.kind in ("CordonDecode", "UncordonDecode"):
        return await r.kind.cordon(r.spec, seen, action, r.now)
    if action.kind in ("RestartDecode", "RestartPrefill"):
        return await r.kind.restart(r.spec, seen, action, r.now)
    raise ValueError(f"unknown action {action.kind}")


def _kill_point(point: KillPoint, action: str) -> None:
    """SIGKILL this process if KILL_AT_ENV names this point (and this action, if it names one)."""
    wanted = os.environ.get(KILL_AT_ENV)
    if not wanted:
        return
    at, _, only = wanted.partition(":")
    if at == point and only in ("", action):
        log.warning("%s=%s: killing this operator process now", KILL_AT_ENV, wanted)
        os.kill(os.getpid(), signal.SIGKILL)
