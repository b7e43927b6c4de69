"""The confirm stage: ask suspect pods themselves before a suspicion is acted on.

Why a module of its own, beside the cycle: the one-token canary on a decode a prefill's expired
lease names (`confirm.canary`) and the pair canary through a still pod's prefill/decode pair
(`confirm.pair_canary`) are the cycle's only waits on pods' answers; keeping the shell that
sends them, counts them and remembers what they added to the pods' counters here keeps the cycle
short. What the verdicts mean for the plan is pure (`decide.verdicts`, `decide.pairs`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from pdwarden import engines, metrics
from pdwarden.api import LedgerEntry
from pdwarden.remediation.decide import PodState, verdicts
from pdwarden.remediation.decide.pairs import (
    SUSPICION,
    ask_again,
    ask_kv_again,
    held_dead,
    judged,
    kv_counts,
    pairs_to_ask,
    with_pair_outcomes,
)
from pdwarden.remediation.detect.evidence import PodView
from pdwarden.remediation.detect.rules import Detection
from pdwarden.remediation.memory import DeploymentMemory, PodMemory
from pdwarden.remediation.scrape import sanitize
from pdwarden.remediation.seams import Round, Seen
from pdwarden.values import CanaryCost, CanaryResult, PairCanary, PairResult, Target

log = logging.getLogger("pdwarden.remediation.cycle")


async def confirm(
    r: Round[Any, Any, Any],
    detection: Detection,
    decodes: Sequence[PodState],
    history: Sequence[LedgerEntry],
) -> Detection:
    """The confirm stage (engine vllm): a canary on each candidate decode (`decide.verdicts`), all
    at once, each under its own deadline, at most one per pod; the verdicts folded into the
    detection the plan, the status and the Events read. Never raises (but cancellation).

    A dead decode holds this cycle (and the object's lock) for the canary's deadline
    (`confirm.canary.CANARY_SECONDS`): the price of never calling a slow engine dead. The
    cycle's clock (`r.now`) was read before, so ages the plan computes are, if anything, short.
    """
    dry_run = r.spec.remediation.mode == "DryRun"
    names = verdicts.candidates(r.spec.engine, detection, decodes, history, dry_run=dry_run)
    # A decode a pair canary already judged this cycle (`confirm_pairs`, run first) is not asked
    # again: a dead one would hold the cycle for the whole deadline to learn nothing new.
    names = tuple(n for n in names if n not in detection.canaries)
    targets = [t for t in (r.seen.target(n) for n in names) if t is not None]
    if not targets:
        return detection

    async def one(t: Target) -> CanaryResult:
        try:
            res = await r.tools.canary.probe(t, r.seen.tenant)
        except Exception as e:  # contained per pod: it proves nothing, nothing else is hurt
            metrics.ERRORS.labels("canary").inc()
            why = f"canary failed: {type(e).__name__}: {sanitize.why(e)}"
            return CanaryResult(t.pod, "unknown", sanitize.text(why, sanitize.MAX_ERROR))
        # Attributed to the pod asked, whatever the answer says; every string bounded.
        return CanaryResult(t.pod, res.verdict, sanitize.text(res.detail, sanitize.MAX_ERROR))

    started = time.monotonic()
    results = await asyncio.gather(*(one(t) for t in targets))
    cost = CanaryCost(len(results), 2 * len(results), time.monotonic() - started)
    _count("token", cost)
    for res in results:
        metrics.CANARIES.labels(res.verdict).inc()
        if res.verdict != "alive":  # dead is acted on (and warned of); unknown only logged
            log.log(
                logging.WARNING if res.verdict == "dead" else logging.INFO,
                "%s/%s: canary on %s: %s (%s)", r.seen.namespace, r.body["metadata"]["name"],
                res.pod, res.verdict, res.detail,
            )  # fmt: skip
    detection = replace(detection, canary_cost=detection.canary_cost + cost)
    return verdicts.with_verdicts(detection, results)


async def confirm_pairs(
    r: Round[Any, Any, Any], detection: Detection, views: Sequence[PodView]
) -> Detection:
    """The confirm stage's pair canaries (engines that have one, `Engine.pair_canary`): each
    still pod, at most once per canary.quietSeconds, gets a canary through its pair's own PD
    path, and a side that missed it is asked again at once until it answers or missed
    canary.failureThreshold in a row (`decide.pairs` picks the pairs, counts the misses and
    reads the outcomes); what each canary added to the pods' counters is remembered, so
    detection never reads it as progress. Never raises (but cancellation)."""
    shape = engines.get(r.spec.engine).pair_canary
    knobs = r.spec.remediation.canary
    if shape is None or not knobs.enabled or r.tools.pair is None:
        return detection
    sender = r.tools.pair
    uids = {v.name: v.uid for v in views}
    asked = {n: at for n, u in uids.items() if (at := _canary_at(r.mem, u)) is not None}
    misses = {n: pm.canary_misses for n, u in uids.items() if (pm := r.mem.pods.get(u))}
    kv_before = {n: pm.kv_failures for n, u in uids.items() if (pm := r.mem.pods.get(u))}
    confirm = {f.pod for f in detection.findings if f.reason == SUSPICION and not f.confirmed}
    threshold = knobs.failure_threshold
    started = time.monotonic()
    pairs = [
        (p, d, pt, dt)
        for p, d in pairs_to_ask(views, asked, started, knobs.quiet_seconds, confirm)
        if (pt := r.seen.target(p)) is not None and (dt := r.seen.target(d)) is not None
    ]
    now_asked = {name for p, d, _, _ in pairs for name in (p, d)}
    held = held_dead(views, misses, threshold, now_asked)
    if not pairs:
        moved = _kv_moved(r, uids, started)
        return with_pair_outcomes(
            detection, [], held, kv_failures=kv_before, threshold=threshold, kv_moved=moved
        )
    for name in now_asked:
        r.mem.pods.setdefault(uids[name], PodMemory()).canary_at = started

    async def send(pt: Target, dt: Target) -> PairResult:
        # The first canary through a pair makes its KV handshake: the long deadline (measured).
        # Health checks make none (a pair whose canary only ever answers "alive" would wait
        # firstDeadlineSeconds every time: SGLang's own 20 s verdict came first, twice).
        warm = shape.protocol == "health" or (
            (_incarnation(r.seen, pt), _incarnation(r.seen, dt)) in r.mem.warm_pairs
        )
        deadline = float(knobs.deadline_seconds if warm else knobs.first_deadline_seconds)
        try:
            res = await sender.pair(pt, dt, shape, r.seen.tenant, deadline)
        except Exception as e:  # contained per pair: it proves nothing, nothing else is hurt
            metrics.ERRORS.labels("canary").inc()
            why = sanitize.text(f"pair canary failed: {type(e).__name__}", sanitize.MAX_ERROR)
            return PairResult(pt.pod, dt.pod, "unknown", why)
        # Attributed to the pods asked, whatever the answers said; every string bounded.
        return replace(res, prefill=pt.pod, decode=dt.pod,
                       detail=sanitize.text(res.detail, sanitize.MAX_ERROR))  # fmt: skip

    async def one(pt: Target, dt: Target) -> list[PairResult]:
        # A miss below the threshold is asked again at once: misses in a row, back to back.
        # So is a KV request that did not complete through a prefill suspected of failing them.
        out = [await send(pt, dt)]
        while ask_again(out, misses, threshold) or ask_kv_again(out, kv_before, threshold, confirm):
            out.append(await send(pt, dt))
        return out

    sent = await asyncio.gather(*(one(pt, dt) for _, _, pt, dt in pairs))
    ended = time.monotonic()
    through = [(pt, dt) for (_, _, pt, dt), rs in zip(pairs, sent, strict=True) for _ in rs]
    results, counts = judged([res for rs in sent for res in rs], misses, threshold)
    kv_after = {**kv_before, **kv_counts(results, kv_before)}
    legs = sum(int(res.prefill_sent) + int(res.decode_sent) + 2 * res.kv_sent for res in results)
    cost = CanaryCost(len(results), legs, ended - started)
    _count("pair", cost)
    detection = replace(detection, canary_cost=detection.canary_cost + cost)
    for name, n in counts.items():
        if name in uids:
            r.mem.pods.setdefault(uids[name], PodMemory()).canary_misses = n
    for name, n in kv_after.items():
        if name in uids:
            r.mem.pods.setdefault(uids[name], PodMemory()).kv_failures = n
    for res in results:
        if res.outcome == "decoded" and res.prefill in uids:
            r.mem.pods.setdefault(uids[res.prefill], PodMemory()).kv_moved_at = ended
    for (pt, dt), res in zip(through, results, strict=True):
        metrics.PAIR_CANARIES.labels(res.outcome).inc()
        if res.outcome == "decoded":
            metrics.PAIR_CANARY_SECONDS.observe(res.seconds)
            r.mem.warm_pairs.add((_incarnation(r.seen, pt), _incarnation(r.seen, dt)))
        for name, role, sent_leg in ((res.prefill, "prefill", res.prefill_sent),
                                     (res.decode, "decode", res.decode_sent)):  # fmt: skip
            # Health checks add nothing read as progress; what a "health" canary owes is its
            # KV request's, which went to both sides.
            owes = sent_leg if shape.protocol == "pd" else res.kv_sent
            if owes and name in uids:
                pm = r.mem.pods.setdefault(uids[name], PodMemory())
                pm.canary_effects.append((ended, _owed(shape, role, res)))
        if res.outcome not in ("decoded", "alive"):
            log.log(
                logging.WARNING if res.outcome.endswith("_dead") or res.outcome == "suspect"
                else logging.INFO,
                "%s/%s: pair canary %s -> %s: %s (%s)", r.seen.namespace,
                r.body["metadata"]["name"], res.prefill, res.decode, res.outcome, res.detail,
            )  # fmt: skip
    moved = _kv_moved(r, uids, ended)
    return with_pair_outcomes(
        detection, results, held, kv_failures=kv_after, threshold=threshold, kv_moved=moved
    )


def _kv_moved(r: Round[Any, Any, Any], uids: Mapping[str, str], now: float) -> set[str]:
    """The pods a canary's KV moved through within the wedge window: their path works."""
    window = r.spec.remediation.wedge_after_seconds
    return {
        name
        for name, uid in uids.items()
        if (pm := r.mem.pods.get(uid)) is not None
        and pm.kv_moved_at is not None
        and now - pm.kv_moved_at <= window
    }


def _owed(shape: PairCanary, role: str, res: PairResult) -> Mapping[str, float]:
    """What one canary may have added to a pod's counters: its measured `effects` when it
    decoded; otherwise those or its `failed_effects` (a request past its deadline may still
    complete; only what a counter really rose by is taken off, `memory.organic`)."""
    done = shape.effects.get(role, {})
    if res.outcome == "decoded":
        return done
    return {**done, **shape.failed_effects.get(role, {})}


def _count(kind: str, cost: CanaryCost) -> None:
    metrics.CANARY_REQUESTS.labels(kind).inc(cost.requests)
    metrics.CANARY_WAIT_SECONDS.labels(kind).inc(cost.seconds)


def _incarnation(seen: Seen, target: Target) -> str:
    """The pod's uid and its containers' restarts: a restarted engine must make its KV
    handshake again, so its pairs are cold again."""
    pod = seen.pod(target.pod) or {}
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    restarts = sum(int(c.get("restartCount") or 0) for c in statuses if isinstance(c, dict))
    return f"{target.uid}/{restarts}"


def _canary_at(mem: DeploymentMemory, uid: str) -> float | None:
    pm = mem.pods.get(uid)
    return pm.canary_at if pm is not None else None
