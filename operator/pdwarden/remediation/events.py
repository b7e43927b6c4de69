"""The Events a remediation cycle posts: a new wedge once, every ledger entry once, and each
configuration advisory once per pod while it lasts.

Why its own module: Events are what users read first (`kubectl describe`), and they must follow
the ledger exactly: an action's Events are named after its ledger entry, so the replica that
completes an action a dead one started posts them if they are missing and the API server refuses
a second copy (409), which reads as already posted. Posting never raises (k8s.event_sink).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Literal

from pdwarden import metrics
from pdwarden.api import LedgerEntry
from pdwarden.k8s.event_sink import post_event
from pdwarden.ports import KubeApi
from pdwarden.remediation.detect.advisories import PodAdvice
from pdwarden.remediation.detect.rules import Detection
from pdwarden.remediation.memory import DeploymentMemory, Observation, WorkerPod, new_findings

log = logging.getLogger("pdwarden.remediation.events")
MAX_NAME_STEM = 200  # an Event name is a DNS subdomain (253); the entry id is appended
# New advisory Events per cycle: a fleet whose pods all carry one flag is announced over a few
# cycles instead of in one burst at the API server.
MAX_ADVISORY_EVENTS = 16


def event_name(involved: str, entry: LedgerEntry) -> str | None:
    """The Event's name for an entry (None: a random one, for entries without an id)."""
    return f"{involved[:MAX_NAME_STEM].rstrip('.-')}.{entry.id}" if entry.id else None


async def report_entry(client: KubeApi, body: Mapping[str, Any], entry: LedgerEntry) -> None:
    """An Event on the owner object and one on the pod, once each."""
    meta = body["metadata"]
    verb = f"DryRun{entry.action}" if entry.dry_run else entry.action
    message = f"{'would ' if entry.dry_run else ''}{entry.action} {entry.pod}: {entry.reason}"
    kind: Literal["Normal", "Warning"] = "Warning" if entry.outcome == "Failed" else "Normal"
    await post_event(client, dict(body), verb, message, kind, name=event_name(meta["name"], entry))
    pod_ref = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": entry.pod, "namespace": meta["namespace"],
                            "uid": entry.uid or None}}  # fmt: skip
    await post_event(client, pod_ref, verb, message, kind, name=event_name(entry.pod, entry))
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
        await post_event(
            client, dict(body), "WedgeDetected", f"{f.reason} on {f.pod}: {f.evidence}", "Warning"
        )


async def announce_refused(
    client: KubeApi,
    body: Mapping[str, Any],
    mem: DeploymentMemory,
    workers: Sequence[WorkerPod],
    observations: Mapping[str, Observation],
) -> None:
    """A MetricsTooLarge Warning the first cycle a pod's /metrics answer is over the byte cap:
    such a pod is never judged (no wedge on it is found) until it serves less or the operator
    is given a larger --max-metrics-bytes, and that must not be silent."""
    names = {w.uid: w.name for w in workers}
    refused = {names[uid] for uid, o in observations.items() if o.refused and uid in names}
    for pod in sorted(refused - mem.too_large):
        metrics.SCRAPE_REFUSED.inc()
        error = next(o.error for uid, o in observations.items() if names.get(uid) == pod)
        await post_event(
            client, dict(body), "MetricsTooLarge",
            f"{pod} is not judged: {error}; raise the operator's --max-metrics-bytes (Helm "
            "value metrics.maxBytes) or reduce what the pod exports", "Warning",
        )  # fmt: skip
    mem.too_large = refused


async def announce_advisories(
    client: KubeApi,
    body: Mapping[str, Any],
    mem: DeploymentMemory,
    advisories: Sequence[PodAdvice],
) -> None:
    """A ConfigurationAdvisory Warning on the object, once per pod and rule while it lasts (not
    every cycle). Its name derives from the object, the pod incarnation and the rule, so another
    replica or a restarted operator posting it again is refused (409: already posted); one that
    could not be posted is tried again next cycle."""
    meta = body["metadata"]
    mem.advised &= {a.key for a in advisories}
    posted = 0
    for a in advisories:
        if a.key in mem.advised:
            continue
        if posted == MAX_ADVISORY_EVENTS:
            break
        posted += 1
        name = f"{meta['name'][:MAX_NAME_STEM].rstrip('.-')}.{a.event_id(str(meta.get('uid')))}"
        if await post_event(
            client, dict(body), "ConfigurationAdvisory", a.sentence(), "Warning", name=name
        ):
            mem.advised.add(a.key)
