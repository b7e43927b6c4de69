"""How a cycle learns what its pods say: each pod scraped (direct mode), or Prometheus's screen
for all and a direct read of the suspects (prometheus mode, issue 34).

Why a stage of its own: in prometheus mode the routine reading of thousands of pods is
Prometheus's, but no action may rest on it. So a pod is read directly (its /metrics, and its
rooms where its engine lists them) when the screen cannot vouch for it or when it is suspect:
 - Prometheus could not scrape it (`up` is not 1), or more than one scrape job holds its series;
 - a wedge found on it (or naming it as the peer) is still held, it is a cordoned decode, or a
   pair canary through it is counting misses or failures;
 - its engine lists rooms (pdworker) and any pod of the object holds work: a prefill's rooms
   say which decode it works for, and no metric does (quiet prefills hold no rooms to read);
 - detection, run on the screen, found something on it this cycle (`verify`): the pods named
   are read directly and detection runs again, and a finding or a stalled decode that still
   rests on a screened sample is dropped.
A pod the screen cannot tell about (absent from Prometheus's answer, its last scrape too old, its
series from another address) and every pod when Prometheus does not answer usefully are not
judged at all: stale, like a pod that does not answer a scrape, and the object's `Screened`
condition says why. Nothing is read directly in their place: a Prometheus that lost its targets
must not turn into thousands of direct scrapes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from pdwarden import metrics
from pdwarden.constants import CONDITION_SERVING, ROLE_DECODE
from pdwarden.ports import WorkerApi
from pdwarden.remediation.detect.evidence import Finding, PodView
from pdwarden.remediation.detect.rules import Detection, detect
from pdwarden.remediation.memory import (
    DeploymentMemory,
    Observation,
    WorkerPod,
    observation,
    pod_views,
    remember,
)
from pdwarden.remediation.scrape import sanitize
from pdwarden.remediation.scrape.samples import QUEUE_FIELDS
from pdwarden.remediation.seams import Seen, Tools
from pdwarden.values import Sample, Screened, ScreenReport

# Gauges that say a pod holds work (a request queued, in flight or running).
HOLDING: tuple[str, ...] = (*QUEUE_FIELDS, "running", "waiting_queue", "reading_queue")
MAX_REPORTED = 8  # pods named in a condition's message


@dataclass
class Observed:
    """This cycle's observations, and which pods were judged from the screen alone."""

    observations: dict[str, Observation]
    screened: set[str]  # pod uids


async def observe(
    tools: Tools, seen: Seen, lost: Mapping[str, str], mem: DeploymentMemory, max_age: float
) -> Observed:
    """Every pod of `seen`: scraped (no screen), or screened with the suspects read directly.
    `max_age`: how old Prometheus's last scrape of a pod may be. Sets `seen.screen`."""
    if tools.screen is None:
        return Observed(await scrape_direct(tools.workers, seen, lost), set())
    asked = [w for w in seen.workers if w.name not in lost]
    view = await tools.screen.look(seen.namespace, [seen.targets[w.uid] for w in asked], max_age)
    looks = {w.uid: view.pods.get(w.uid) or Screened(missing="not asked") for w in asked}
    direct: set[str] = set()
    screened: set[str] = set()
    out: dict[str, Observation] = {}
    missing: dict[str, str] = {}
    if view.error:
        for w in asked:
            why = f"Prometheus ({view.source}) gave no usable answer: {view.error}"
            out[w.uid] = Observation(w.uid, error=sanitize.error(why))
            missing[w.name] = view.error
    else:
        suspects = suspected(seen, mem)
        busy = any(_holding(s.sample) for s in looks.values())
        for w in asked:
            look = looks[w.uid]
            if look.missing:
                out[w.uid] = Observation(w.uid, error=sanitize.error(f"Prometheus: {look.missing}"))
                missing[w.name] = look.missing
            elif look.direct or w.name in suspects or (w.rooms and busy) or look.sample is None:
                direct.add(w.uid)
            else:
                out[w.uid] = Observation(w.uid, sample=look.sample)
                screened.add(w.uid)
    gone = {w.uid for w in seen.workers if w.name in lost}  # not asked: their reason is kept
    out.update(await scrape_direct(tools.workers, seen, lost, only=direct | gone))
    seen.screen = ScreenReport(
        source=view.source, pods=len(seen.workers), screened=len(screened), direct=len(direct),
        missing=missing, error=view.error,
    )  # fmt: skip
    metrics.SCREENED.labels("screened").inc(len(screened))
    metrics.SCREENED.labels("direct").inc(len(direct))
    metrics.SCREENED.labels("unjudged").inc(len(missing))
    return Observed(out, screened)


def suspected(seen: Seen, mem: DeploymentMemory) -> set[str]:
    """Pods read directly whatever the screen says: named by a wedge still held (as the pod or
    its peer), cordoned decodes, and pods a pair canary is counting against."""
    names = {n for pod, _, peer in mem.first_seen for n in (pod, peer) if n}
    for w in seen.workers:
        pm = mem.pods.get(w.uid)
        if pm is not None and (pm.canary_misses or pm.kv_failures):
            names.add(w.name)
        if w.role == ROLE_DECODE and _cordoned(seen.pod(w.name)):
            names.add(w.name)
    return names


def _cordoned(pod: Mapping[str, object] | None) -> bool:
    status = (pod or {}).get("status")
    conditions = status.get("conditions") if isinstance(status, Mapping) else None
    return any(
        isinstance(c, Mapping) and c.get("type") == CONDITION_SERVING and c.get("status") == "False"
        for c in conditions or []
    )


def _holding(sample: Sample | None) -> bool:
    return sample is not None and any((getattr(sample, f) or 0) > 0 for f in HOLDING)


def rests_on(finding: Finding) -> set[str]:
    """The pods a finding names: its pod, its peer, its suspects."""
    return {finding.pod, *(p for p in (finding.peer,) if p), *finding.suspects}


def named(detection: Detection) -> set[str]:
    """Pods a detection's findings and stalled decodes rest on."""
    out = set(detection.stalled_decodes)
    for f in detection.findings:
        out |= rests_on(f)
    return out


async def verify(
    tools: Tools,
    seen: Seen,
    observed: Observed,
    detection: Detection,
    mem: DeploymentMemory,
    *,
    lost: Mapping[str, str],
    keep_seconds: float,
    interval: float,
    wedge_after: float,
) -> tuple[Detection, list[PodView]] | None:
    """Prometheus mode: read directly the screened pods this detection rests on, and detect
    again; None when it rests on no screened pod (nothing to do). What still rests on a
    screened pod afterwards (its direct read failed) is dropped: never acted on."""
    uids = {w.name: w.uid for w in seen.workers}
    wanted = {uids[n] for n in named(detection) if n in uids} & observed.screened
    if not wanted:
        return None
    fresh = await scrape_direct(tools.workers, seen, lost, only=wanted)
    observed.observations.update(fresh)
    observed.screened -= wanted
    if seen.screen is not None:
        seen.screen = replace(
            seen.screen, screened=seen.screen.screened - len(wanted),
            direct=seen.screen.direct + len(wanted),
        )  # fmt: skip
    metrics.SCREENED.labels("direct").inc(len(wanted))
    remember(mem, list(fresh.values()), keep_seconds, forget=False)
    views = pod_views(seen.workers, observed.observations, mem, time.monotonic(), interval)
    again = detect(views, wedge_after)
    screened = {w.name for w in seen.workers if w.uid in observed.screened}
    return rested_on_direct(again, screened), views


def rested_on_direct(detection: Detection, screened: set[str]) -> Detection:
    """`detection` less what rests on a pod judged from the screen alone (by name)."""
    if not screened:
        return detection
    kept = tuple(f for f in detection.findings if not rests_on(f) & screened)
    return replace(detection, findings=kept, stalled_decodes=detection.stalled_decodes - screened)


async def scrape_direct(
    workers: WorkerApi,
    seen: Seen,
    lost: Mapping[str, str] | None = None,
    only: set[str] | None = None,
) -> dict[str, Observation]:
    """Scrape every pod of one tenant (its own share of the client), or the pods of `only`
    (uids); one pod's failure, whatever it is, is that pod's error only. A pod on a lost node
    is not asked: its observation is the reason it cannot be judged (not a scrape error)."""
    lost = lost or {}
    pods: Sequence[WorkerPod] = [w for w in seen.workers if only is None or w.uid in only]

    async def one(w: WorkerPod) -> Observation:
        if w.name in lost:
            return Observation(w.uid, error=sanitize.error(lost[w.name]))
        try:
            token = seen.token if w.rooms else None  # only a pod with an admin API gets it
            target = seen.targets[w.uid]
            (res,) = await workers.scrape([target], token, seen.tenant)
            if res.auth_refused and seen.fallback_token:  # it has not read a rotated token yet
                (res,) = await workers.scrape([target], seen.fallback_token, seen.tenant)
            return observation(w.uid, res.sample, res.rooms, res.error, res.refused)
        except Exception as e:  # contained per pod: the pod is stale this cycle, nothing else
            metrics.ERRORS.labels("scrape").inc()
            why = sanitize.error(f"{type(e).__name__}: {sanitize.why(e)}")
            return Observation(w.uid, error=why)

    results = await asyncio.gather(*(one(w) for w in pods))
    asked = [o for w, o in zip(pods, results, strict=True) if w.name not in lost]
    metrics.SCRAPES.inc(len(asked))
    metrics.SCRAPE_ERRORS.inc(sum(1 for o in asked if o.sample is None))
    return {o.uid: o for o in results}
