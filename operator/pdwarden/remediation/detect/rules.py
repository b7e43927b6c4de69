"""Wedge detection: from recent samples and rooms of every worker pod to findings with evidence.

Why pure: these rules decide when pdwarden touches a production deployment, so they are plain
functions over recorded data, unit-tested on sample series. The rules:

* InflightStuck: a prefill room has spent longer than wedgeAfterSeconds in the inflight queue
  (prefill finished, transfer not). Time in that queue, never time since the request arrived:
  a long prefill is legal. Rooms are attributed to the decode pod they wait on.
* PeerIncarnationGone: a prefill room waits on a decode incarnation that no longer exists (the
  pod restarted or vanished). Flagged at once: that peer will never answer.
* InflightGaugeStuck: for engines without a rooms API (stock SGLang), the inflight queue did not
  drain for the whole window: it held rooms in every sample, not one room left it (no KV transfer
  finished, none failed, no request finished), every decode pod was in sight over the window (a
  gone or unreachable decode may be what the rooms wait on, and SGLang's gauges then keep their
  last snapshot), and, where the prefill's settings let rooms into that
  queue before their decode allocated KV (`PodView.rooms_wait_for_decode_kv`), no decode pod is busy
  with a backlog of requests waiting for KV slots (then the one legal reason for rooms to wait
  there). A queue that is never empty under load is steady state, not a wedge: what matters is that
  it stopped moving. Counters that a health-check probe moves never count as drain (the engine
  modules, `pdwarden.engines`). Wedged rooms hidden among healthy traffic that keeps draining the
  queue cannot be seen this way (no per-room ages); the rooms API rule above sees them.
* TransfersFailing: for the same engines, the prefill's failure counters (SGLang: bootstrap
  and transfer failures) rose at FAILED_SCRAPES scrapes or more of the window while not one KV
  transfer succeeded and every decode pod was in sight: a pair whose KV path broke while both
  sides stay Ready (stale peer state after a restart, a broken fabric). Client aborts count as
  failures too, and a decode that went away fails its rooms: so it is a suspicion that a pair
  canary confirms (no KV moves while both sides answer their health checks) before any repair.
* DecodeStalled: a decode pod held requests for the whole window while nothing showed progress:
  its per-step token counter flat (for engines without one, its throughput 0: with one, a
  throughput gauge is no evidence, since a hung scheduler freezes its gauges), no request
  finished (and, for requests only queued, no KV arrived). Only signals that move while
  requests run can prove a stall (`pdwarden.engines`: never a counter that moves only when a
  request ends). Requests merely queued (prealloc, transfer) count only when no prefill was
  computing a room for that pod or sending its KV at any scrape of the window (a room that
  succeeded a moment before its prefill's rooms were read is gone from the latest list, while
  the decode's sample, read a moment earlier, still queues it); requests *running* always do.

A pod whose metrics are stale or missing is *unknown*: never healthy, never wedged.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from pdwarden.constants import ROLE_DECODE, ROLE_PREFILL
from pdwarden.remediation.detect.evidence import Finding, PodView
from pdwarden.remediation.detect.evidence import moved as _moved
from pdwarden.remediation.detect.evidence import window_of as _window
from pdwarden.remediation.detect.failing import in_sight, transfers_failing
from pdwarden.remediation.detect.pull import pull_findings
from pdwarden.values import CanaryCost, CanaryResult, RoomView, Sample

INFLIGHT_PHASE = "inflight"
FORWARD_PHASE = "forward"
MAX_ROOMS_PER_FINDING = 256
MAX_WORKING_PEERS = 256  # peers remembered per earlier rooms list (`working_rooms`)


@dataclass(frozen=True)
class Detection:
    findings: tuple[Finding, ...] = ()
    unknown: tuple[str, ...] = ()  # pods we could not judge, with why
    stalled_decodes: frozenset[str] = field(default_factory=frozenset)
    # Decode pods with a full window of fresh samples and no stall: positive evidence of health,
    # which is what an uncordon needs (no evidence at all, e.g. after an operator restart, is not).
    healthy_decodes: frozenset[str] = field(default_factory=frozenset)
    # This cycle's canary verdicts by decode pod (vLLM: remediation.decide.verdicts folds them in;
    # a dead one is also in stalled_decodes and never in healthy_decodes).
    canaries: Mapping[str, CanaryResult] = field(default_factory=dict, hash=False)
    # What this cycle's canaries cost (the confirm stage adds it; the ledger sums it).
    canary_cost: CanaryCost = field(default_factory=CanaryCost)

    @property
    def dead_decodes(self) -> frozenset[str]:
        """Decode pods a canary confirmed dead this cycle: their engine produced no token, so
        they serve nobody whatever their readiness says."""
        return frozenset(n for n, c in self.canaries.items() if c.verdict == "dead")

    @property
    def wedged_rooms(self) -> int:
        return sum(f.room_count for f in self.findings if f.role == ROLE_PREFILL)

    def implicated_decodes(self) -> frozenset[str]:
        peers = {f.peer for f in self.findings if f.peer and f.reason == "InflightStuck"}
        return frozenset(peers) | self.stalled_decodes


def _progressed(window: Sequence[Sample], *counters: str) -> bool:
    """Tokens generated, or one of `counters` moved. A per-step token counter, when reported,
    is the authority: a scheduler that hangs freezes every gauge, so a throughput gauge stuck
    at its last value proves nothing against a flat counter. Without one, throughput > 0."""
    if any(_moved(window, c) for c in ("generated_tokens", *counters)):
        return True
    if all(s.generated_tokens is not None for s in window):
        return False
    return any((s.throughput or 0) > 0 for s in window)


def decode_stalled(
    history: Sequence[Sample], window_seconds: float, waiting_on_prefill: bool = False
) -> str | None:
    """Evidence text if the decode pod made no progress with work queued, for the window.

    A decode whose requests wait for a prefill that is still computing (a long prefill) is
    legitimately idle: then only requests stuck while *running* count as a stall.
    """
    window = _window(history, window_seconds)
    if window is None:
        return None
    queued = all(_decode_work(s) > 0 for s in window)
    running = all(s.queue("running") > 0 for s in window)
    if not (running or (queued and not waiting_on_prefill)):
        return None
    # Progress: tokens generated, throughput, requests finished; for requests only queued, KV
    # arriving too (a stalled pdworker decode still lands KV for requests it never runs).
    if _progressed(window, "completed"):
        return None
    if not running and _moved(window, "kv_transfers"):
        return None
    first, last = window[0], window[-1]
    # Only a signal that moves while requests run can prove that nothing moved.
    if all(s.generated_tokens is not None for s in window):
        progress = f"generated tokens flat at {last.generated_tokens:g}"
    elif all(s.throughput is not None for s in window):
        progress = "generation throughput 0"
    else:
        return None
    span = last.at - first.at
    return (
        f"prealloc queue {last.queue('prealloc_queue'):g}, transfer queue "
        f"{last.queue('transfer_queue'):g}, running {last.queue('running'):g} for {span:.0f}s "
        f"with {progress}"
    )


def _decode_work(s: Sample) -> float:
    """Requests a decode pod holds: waiting for pages or handshake, for KV, or decoding."""
    return s.queue("prealloc_queue") + s.queue("transfer_queue") + s.queue("running")


# Counters that move when a room leaves a prefill's inflight queue, by success or failure.
DRAIN_COUNTERS = ("kv_transfers", "failed", "completed")


def inflight_not_draining(
    history: Sequence[Sample],
    window_seconds: float,
    decodes: Sequence[PodView],
    waits_for_decode_kv: bool = True,
) -> str | None:
    """Evidence text if a prefill's inflight queue held rooms and none left it, for the window,
    while no decode pod is busy with a backlog that those rooms could be waiting for (asked
    only if `waits_for_decode_kv`: rooms can enter the queue before their decode allocated)."""
    window = _window(history, window_seconds)
    if window is None or not all(s.queue("inflight_queue") > 0 for s in window):
        return None
    if all(getattr(window[-1], c) is None for c in DRAIN_COUNTERS):
        return None  # the engine reports no drain at all: we cannot tell
    if any(_moved(window, c) for c in DRAIN_COUNTERS):
        return None  # rooms left the queue: busy, not wedged, however full it is
    start, end = window[0].at, window[-1].at
    stuck = min(s.queue("inflight_queue") for s in window)
    head = (
        f"inflight queue held >= {stuck:g} rooms for {end - start:.0f}s and none left it "
        f"(no KV transfer finished or failed)"
    )
    if not in_sight(decodes, window):
        # A decode we cannot see over the window may be the one the rooms wait on: gone,
        # restarting (its repair is its own: the kubelet's, or ours on a dead verdict), or
        # unreachable. Seen on the real SGLang pair: a prefill's gauges keep their last snapshot
        # while its decode is away, and acting on it restarted a healthy prefill.
        return None
    if not waits_for_decode_kv:
        return f"{head}; this prefill never parks a room there to wait for its decode's KV slots"
    for d in decodes:
        seen = [s for s in d.history if start <= s.at <= end] or [d.history[-1]]
        if all(s.queue("prealloc_queue") > 0 for s in seen) and _progressed(
            seen, "completed", "kv_transfers"
        ):
            return None  # a busy decode is short of KV slots: rooms wait for it legally
    return f"{head}; no decode pod is busy with a backlog"


def _prefill_findings(
    pod: PodView,
    wedge_after: float,
    decode_incarnations: dict[str, str | None],
    decodes: Sequence[PodView],
) -> list[Finding]:
    latest = pod.latest
    assert latest is not None
    if pod.rooms is None:
        failing = transfers_failing(pod.history, wedge_after, decodes)
        out = [] if failing is None else [
            Finding(pod=pod.name, role=ROLE_PREFILL, reason="TransfersFailing", evidence=failing,
                    peer=decodes[0].name if len(decodes) == 1 else None)
        ]  # fmt: skip
        evidence = inflight_not_draining(
            pod.history, wedge_after, decodes, pod.rooms_wait_for_decode_kv
        )
        if evidence is None:
            return out
        window = _window(pod.history, wedge_after) or pod.history
        # Rooms held since the queue was last seen empty (memory reaches back past the history),
        # the window at least: the ladder tells a queue never emptied by its abort from a new
        # wedge after an abort that emptied it (`decide.rungs.next_prefill_step`).
        empty = pod.inflight_empty_at
        since = min(window[0].at, empty if empty is not None else math.inf)
        return [
            *out,
            Finding(
                pod=pod.name, role=ROLE_PREFILL, reason="InflightGaugeStuck",
                room_count=int(min(s.queue("inflight_queue") for s in window)),
                oldest_seconds=window[-1].at - since, evidence=evidence,
            ),
        ]  # fmt: skip
    gone: dict[str | None, list[RoomView]] = {}
    stuck_by_peer: dict[str | None, list[RoomView]] = {}
    for room in pod.rooms:
        peer = room.peer_pod
        if peer is not None and room.peer_incarnation and peer in decode_incarnations:
            current = decode_incarnations[peer]
            if current is not None and current != room.peer_incarnation:
                gone.setdefault(peer, []).append(room)
                continue
        elif peer is not None and room.peer_incarnation and peer not in decode_incarnations:
            gone.setdefault(peer, []).append(room)
            continue
        if room.phase == INFLIGHT_PHASE and room.phase_seconds > wedge_after:
            stuck_by_peer.setdefault(peer, []).append(room)
    findings = []
    for reason, groups in (("PeerIncarnationGone", gone), ("InflightStuck", stuck_by_peer)):
        for peer, rooms in sorted(groups.items(), key=lambda kv: str(kv[0])):
            oldest = max(r.phase_seconds for r in rooms)
            why = (
                f"{len(rooms)} rooms wait on decode incarnation(s) that no longer exist"
                if reason == "PeerIncarnationGone"
                else f"{len(rooms)} rooms in the inflight queue longer than {wedge_after:g}s"
            )
            findings.append(
                Finding(
                    pod=pod.name, role=ROLE_PREFILL, reason=reason,  # type: ignore[arg-type]
                    rooms=tuple(sorted(r.room for r in rooms))[:MAX_ROOMS_PER_FINDING],
                    room_count=len(rooms), oldest_seconds=oldest, peer=peer,
                    evidence=f"{why} (oldest {oldest:.1f}s); inflight gauge "
                    f"{latest.queue('inflight_queue'):g}",
                )
            )  # fmt: skip
    return findings


def _working(room: RoomView, window_seconds: float) -> bool:
    """The prefill computes this room (phase `forward`) or sends its KV (phase `inflight`,
    younger than the window): its decode waits legitimately until the room is old enough to be
    InflightStuck on the prefill side."""
    return room.phase == FORWARD_PHASE or (
        room.phase == INFLIGHT_PHASE and room.phase_seconds <= window_seconds
    )


def working_rooms(rooms: Sequence[RoomView]) -> tuple[RoomView, ...]:
    """What `_decodes_waiting_on_prefill` needs of a rooms list to judge it later: for each
    peer (verified address and named pod), its room computing if any, else its youngest room
    inflight; at most MAX_WORKING_PEERS of them. A shell keeps this, not whole lists."""
    best: dict[tuple[str | None, str | None], RoomView] = {}
    for r in rooms:
        if r.phase not in (FORWARD_PHASE, INFLIGHT_PHASE):
            continue
        key = (r.peer_ip, r.peer_pod)
        held = best.get(key)
        if held is None:
            if len(best) < MAX_WORKING_PEERS:
                best[key] = r
        elif held.phase == INFLIGHT_PHASE and (
            r.phase == FORWARD_PHASE or r.phase_seconds < held.phase_seconds
        ):
            best[key] = r
    return tuple(best.values())


def _decodes_waiting_on_prefill(
    pods: Sequence[PodView], window_seconds: float
) -> frozenset[str] | _Everyone:
    """Decode pods that some prefill was computing a room for (phase `forward`), or sending
    one's KV to (phase `inflight`, younger than the window), at a scrape inside the window:
    its latest rooms, and `recent_rooms` no older than the window.

    A prefill without a rooms API (SGLang) may be computing for anyone unless its metrics show
    it idle over the window (`prefill_idle`; a wedged inflight queue is that prefill's finding,
    not the decode's). If a prefill pod cannot tell (stale, or no such counter), every decode
    pod may be waiting on it, so queued-but-idle decode pods are not judged stalled.
    """
    names: set[str] = set()
    for pod in pods:
        if pod.role != ROLE_PREFILL:
            continue
        if pod.stale or pod.latest is None:
            return EVERYONE
        if pod.rooms is None:
            if not prefill_idle(pod.history, window_seconds):
                return EVERYONE
            continue
        since = pod.latest.at - window_seconds
        lists = [pod.rooms, *(rooms for at, rooms in pod.recent_rooms if at >= since)]
        names |= {
            r.peer_pod
            for rooms in lists
            for r in rooms
            if r.peer_pod and _working(r, window_seconds)
        }
    return frozenset(names)


# Counters that move when a prefill computes real work or finishes it.
PREFILL_WORK_COUNTERS = ("prefill_tokens", *DRAIN_COUNTERS)


def prefill_idle(history: Sequence[Sample], window_seconds: float) -> bool:
    """A prefill without a rooms API did no work for anyone over the window: nothing running,
    waiting or inflight at any scrape, and no counter of real work moved (at least one is
    reported). SGLang's per-step prompt-token counter is not among them, a probe moves it
    (the engine modules, `pdwarden.engines`); a prefill that computes shows it in its gauges: on
    a PD prefill `num_running_reqs` is the batch in the forward pass, republished every batch."""
    recent = [s for s in history if s.at >= history[-1].at - window_seconds]
    if len(recent) < 2:
        return False
    if not any(all(getattr(s, c) is not None for s in recent) for c in PREFILL_WORK_COUNTERS):
        return False  # the engine reports no work at all: we cannot tell
    if any(_moved(recent, c) for c in PREFILL_WORK_COUNTERS):
        return False
    return all(
        s.queue("running") + s.queue("waiting_queue") + s.queue("inflight_queue") == 0
        for s in recent
    )


class _Everyone:
    def __contains__(self, _: object) -> bool:
        return True


EVERYONE = _Everyone()


def detect(pods: Sequence[PodView], wedge_after: float) -> Detection:
    """Findings over every pod; pods without fresh data are listed as unknown."""
    unknown = tuple(
        sorted(
            f"{p.name}: {p.error or 'no fresh metrics'}" for p in pods if p.stale or not p.latest
        )
    )
    fresh = [p for p in pods if not p.stale and p.latest is not None]
    decodes = [p for p in pods if p.role == ROLE_DECODE]
    # Incarnation per decode pod name: None when unknown (stale), so nothing is judged gone.
    incarnations: dict[str, str | None] = {
        p.name: (p.latest.incarnation if (p.latest and not p.stale) else None) for p in decodes
    }
    findings: list[Finding] = []
    stalled: set[str] = set()
    healthy: set[str] = set()
    waiting = _decodes_waiting_on_prefill(pods, wedge_after)
    for pod in fresh:
        if pod.role == ROLE_PREFILL:
            findings += _prefill_findings(pod, wedge_after, incarnations, decodes)
        elif pod.role == ROLE_DECODE:
            evidence = decode_stalled(pod.history, wedge_after, pod.name in waiting)
            if not evidence and _window(pod.history, wedge_after) is not None:
                healthy.add(pod.name)
            if evidence:
                stalled.add(pod.name)
                findings.append(
                    Finding(pod=pod.name, role=ROLE_DECODE, reason="DecodeStalled",
                            room_count=int(_decode_work(pod.history[-1])),
                            evidence=evidence)
                )  # fmt: skip
    # -- hook: engines whose decode pulls KV (vLLM). A decode with a stuck read, or one whose
    # KV stopped arriving, is not healthy (a cordoned one stays cordoned).

    pulled = pull_findings(pods, wedge_after)
    findings += pulled
    healthy -= {f.pod for f in pulled if f.reason in ("KVReadStuck", "PromptsRecomputed")}
    # -- end hook
    return Detection(tuple(findings), unknown, frozenset(stalled), frozenset(healthy))
