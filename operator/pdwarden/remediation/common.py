"""The parts of a remediation cycle's shell that PDDeployments and PDRemediationPolicies share.

Why a module of its own: both shells (`cycle` for pods pdwarden runs, `policy_cycle` for
pods another system runs) scrape pods with per-pod containment, announce new wedges once, write
an action's ledger entry ahead into memory and report each action as Events on the owner object
and the pod. Keeping that here, once, means the two kinds cannot drift in what users see or in
how an error is contained.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Literal

from pdwarden import metrics
from pdwarden.api import LedgerEntry
from pdwarden.api.status import MAX_MESSAGE
from pdwarden.k8s.events import post_event
from pdwarden.ports import KubeApi, WorkerApi
from pdwarden.remediation.detect.rules import Detection
from pdwarden.remediation.policy.plan import Action, Plan
from pdwarden.remediation.record.ledger import ledger_entry
from pdwarden.remediation.scrape import sanitize
from pdwarden.remediation.scrape.client import Target
from pdwarden.remediation.views import (
    DeploymentMemory,
    Observation,
    WorkerPod,
    new_findings,
    observation,
)

log = logging.getLogger("pdwarden.remediation.cycle")
PENDING = "in progress"


def now_utc() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


def iso(t: datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


def why(e: BaseException) -> str:
    return sanitize.text(str(e) or type(e).__name__, MAX_MESSAGE // 2)


async def scrape_all(
    workers: WorkerApi,
    pods: Sequence[WorkerPod],
    targets: Mapping[str, Target],
    token: str | None,
) -> dict[str, Observation]:
    """Scrape every pod (`targets` by pod uid); one pod's failure, whatever it is, is that pod's
    error only."""

    async def one(w: WorkerPod) -> Observation:
        try:
            (result,) = await workers.scrape([targets[w.uid]], token if w.rooms else None)
            return observation(w.uid, result.sample, result.rooms, result.error)
        except Exception as e:  # contained per pod: the pod is stale this cycle, nothing else
            metrics.ERRORS.labels("scrape").inc()
            return Observation(w.uid, error=sanitize.error(f"{type(e).__name__}: {why(e)}"))

    results = await asyncio.gather(*(one(w) for w in pods))
    metrics.SCRAPES.inc(len(results))
    metrics.SCRAPE_ERRORS.inc(sum(1 for o in results if o.sample is None))
    return {o.uid: o for o in results}


Act = Callable[[Action], Awaitable[LedgerEntry]]


async def execute(
    mem: DeploymentMemory, decision: Plan, now: datetime, act: Act
) -> list[tuple[Action, LedgerEntry]]:
    """Run `act` for every planned action, each entry written ahead into memory: if anything is
    cut short, the next cycle still counts the action (cooldown, breaker) and the next status
    write records it."""
    done = []
    for action in decision.actions:
        pending = ledger_entry(
            action, now=now, dry_run=decision.dry_run, outcome="Succeeded", detail=PENDING
        )
        mem.unrecorded.append(pending)
        entry = await act(action)
        mem.unrecorded[mem.unrecorded.index(pending)] = entry
        done.append((action, entry))
    return done


async def report_action(
    client: KubeApi,
    body: Mapping[str, Any],
    action: Action,
    entry: LedgerEntry,
    dry_run: bool,
) -> None:
    """An Event on the owner object and one on the pod (post_event never raises)."""
    meta = body["metadata"]
    verb = f"DryRun{action.kind}" if dry_run else action.kind
    message = f"{'would ' if dry_run else ''}{action.kind} {entry.pod}: {entry.reason}"
    kind: Literal["Normal", "Warning"] = "Warning" if entry.outcome == "Failed" else "Normal"
    await post_event(client, dict(body), verb, message, kind)
    pod_ref = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": entry.pod, "namespace": meta["namespace"],
                            "uid": action.uid or None}}  # fmt: skip
    await post_event(client, pod_ref, verb, message, kind)
    log.info("%s/%s: %s", meta["namespace"], meta["name"], message)


async def announce_new_wedges(
    client: KubeApi,
    body: Mapping[str, Any],
    mem: DeploymentMemory,
    detection: Detection,
    now: datetime,
) -> None:
    """A WedgeDetected Event the first cycle a finding is seen (not every cycle)."""
    for f in new_findings(mem.first_seen, detection, now):
        metrics.WEDGES_DETECTED.labels(f.reason).inc()
        if f.reason in ("InflightStuck", "PeerIncarnationGone"):
            metrics.TIME_TO_REMEDIATE.observe(sanitize.seconds(f.oldest_seconds))
        await post_event(
            client, dict(body), "WedgeDetected", f"{f.reason} on {f.pod}: {f.evidence}", "Warning"
        )
