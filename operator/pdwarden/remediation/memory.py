"""From pods and scrape results to what detection and the plan judge: targets, memory, staleness.

Why pure: which pods are scraped, which count as stale (never judged, never acted on) and what a
decode pod's serving state is decide whether pdwarden touches a pod at all. These are plain
functions over the pod objects the API server returned and the scrape results of this and
earlier cycles (`DeploymentMemory`, kept by the shell between cycles); no clock is read here.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Final

from pdwarden import engines
from pdwarden.api import LedgerEntry
from pdwarden.constants import CONDITION_SERVING, LABEL_ROLE, ROLE_DECODE, ROLE_PREFILL
from pdwarden.engines import COUNTER_FIELDS
from pdwarden.remediation.decide import PodState
from pdwarden.remediation.detect.evidence import Finding, PodView
from pdwarden.remediation.detect.rules import Detection, working_rooms
from pdwarden.remediation.scrape import sanitize
from pdwarden.values import CanaryCost, RoomView, Sample

Obj = Mapping[str, Any]
STALE_AFTER_INTERVALS: Final = 2.5  # a pod whose last good scrape is older is stale
WORKER_ROLES: Final = (ROLE_PREFILL, ROLE_DECODE)
MAX_CANARY_EFFECTS: Final = 256  # per pod: more than a history window holds at any canary period
# How long after a canary ended its increments may still show up in a pod's counters
# (`organic`): two scrapes at the default interval.
SETTLE_SECONDS: Final = 10.0


@dataclass(frozen=True)
class WorkerPod:
    """A pod to scrape: running, with an IP, of a worker role."""

    name: str
    uid: str
    role: str
    ip: str
    rooms: bool  # also read its rooms (pdworker prefill has an admin rooms API)
    engine: str | None = None  # picks the metrics adapter, so only that engine's series are kept
    # Read from the pod's own command line (`rooms_wait_for_decode_kv`); see `PodView`.
    rooms_wait_for_decode_kv: bool = True
    bootstrap_port: int = 0  # an SGLang prefill's, from its command line (`Target`)


@dataclass(frozen=True)
class Observation:
    """What one scrape of one pod returned (a sample, or an error)."""

    uid: str
    sample: Sample | None = None
    rooms: tuple[RoomView, ...] | None = None
    error: str | None = None
    refused: str = ""  # "too_large": the pod's answer was over the byte cap


@dataclass
class PodMemory:
    samples: deque[Sample] = field(default_factory=deque)
    # (sample time, working rooms) of each good scrape that read rooms: detection asks whether a
    # prefill worked for a decode anywhere in the window, not only in the latest list.
    rooms: deque[tuple[float, tuple[RoomView, ...]]] = field(default_factory=deque)
    last_error: str | None = None
    last_ok: float | None = None
    # What the canaries sent through this pod added to its counters: (monotonic time the canary
    # ended, Sample field -> amount). Detection reads the history without them (`organic`).
    canary_effects: deque[tuple[float, Mapping[str, float]]] = field(
        default_factory=lambda: deque(maxlen=MAX_CANARY_EFFECTS)
    )
    canary_at: float | None = None  # when the last pair canary through this pod began
    canary_misses: int = 0  # pair canaries in a row this pod gave no answer to (`decide.pairs`)
    kv_failures: int = 0  # prefill: canary KV requests failed in a row (`decide.pairs.kv_counts`)
    kv_moved_at: float | None = None  # prefill: when a canary's KV through it last moved
    # The last sample that showed its inflight queue empty, or the first one seen: a queue that
    # holds rooms now has held some ever since, however far back past `samples` that is.
    inflight_empty_at: float | None = None


@dataclass
class DeploymentMemory:
    """What one operator process remembers of one PDDeployment between cycles (lost on restart,
    by design: the durable part is the ledger in status)."""

    pods: dict[str, PodMemory] = field(default_factory=dict)  # by pod uid
    first_seen: dict[tuple[str, str, str], datetime] = field(default_factory=dict)
    # Ledger entries of actions taken but not yet in a status write that succeeded: the next
    # plan counts them (cooldown, breaker) and the next write carries them.
    unrecorded: list[LedgerEntry] = field(default_factory=list)
    foreign: set[str] = field(default_factory=set)  # look-alike pods already reported
    cycles: int = 0  # cycles run by this process: the first one also reconstructs the ledger
    too_large: set[str] = field(default_factory=set)  # pods whose refused body was announced
    # The admin token read last and the one it replaced (a rotated Secret): workers that have
    # not read their new token yet are asked with the old one.
    admin_token: str | None = None
    replaced_token: str | None = None
    # ("uid/restarts" of the prefill, of the decode) of pairs a pair canary decoded through: warm,
    # their KV handshake done, so their canaries get the short deadline (pods still scraped).
    warm_pairs: set[tuple[str, str]] = field(default_factory=set)
    # (pod incarnation, rule) of each configuration advisory announced by an Event, while it lasts.
    advised: set[tuple[str, str]] = field(default_factory=set)
    # What canaries cost since the status last carried the tally (`record.ledger.held_tally`).
    canary_cost: CanaryCost = field(default_factory=CanaryCost)


def _role(pod: Obj) -> str | None:
    role = ((pod.get("metadata") or {}).get("labels") or {}).get(LABEL_ROLE)
    return role if isinstance(role, str) else None


def worker_pod(pod: Obj, engine: str, name: str, uid: str, role: str, *, ip: str) -> WorkerPod:
    """A pod to scrape, with what its engine says about it: whether its prefill lists rooms,
    and whether rooms may wait in its inflight queue for a decode's KV (its launch flags)."""
    e = engines.get(engine)
    return WorkerPod(
        name=name, uid=uid, role=role, ip=ip, rooms=e.rooms_api and role == ROLE_PREFILL,
        engine=engine, rooms_wait_for_decode_kv=e.rooms_wait_for_decode_kv(pod, role),
        bootstrap_port=e.bootstrap_port(pod, role),
    )  # fmt: skip


def scrape_targets(pods: Sequence[Obj], engine: str) -> list[WorkerPod]:
    """Worker pods that can be scraped now: running, not terminating, with a pod IP."""
    out = []
    for pod in pods:
        meta, st = pod.get("metadata") or {}, pod.get("status") or {}
        role = _role(pod)
        if role not in WORKER_ROLES or not st.get("podIP") or not meta.get("uid"):
            continue
        if meta.get("deletionTimestamp") or st.get("phase") != "Running":
            continue
        out.append(
            worker_pod(
                pod, engine, str(meta["name"]), str(meta["uid"]), str(role), ip=str(st["podIP"])
            )
        )
    return out


def observation(
    uid: str,
    sample: Sample | None,
    rooms: Sequence[RoomView] | None,
    error: str | None,
    refused: str = "",
) -> Observation:
    """One scrape result, cleaned: hostile strings and numbers never reach detection."""
    if sample is None:
        return Observation(uid, error=sanitize.error(error) or "no sample", refused=refused)
    clean = None if rooms is None else tuple(sanitize.room(r) for r in rooms)
    return Observation(uid, sample=sample, rooms=clean)


def remember(
    mem: DeploymentMemory, observations: Sequence[Observation], keep_seconds: float, *,
    forget: bool = True,
) -> None:  # fmt: skip
    """Fold this cycle's observations into the per-pod history; forget pods no longer scraped
    (`forget` False: a second read of some pods in one cycle). A sample no newer than the pod's
    latest is not kept: Prometheus's screen repeats a scrape until its next one."""
    alive = {o.uid for o in observations}
    for uid in list(mem.pods):
        if forget and uid not in alive:
            del mem.pods[uid]
    if forget:
        mem.warm_pairs = {w for w in mem.warm_pairs if {k.split("/")[0] for k in w} <= alive}
    for o in observations:
        pm = mem.pods.setdefault(o.uid, PodMemory())
        if o.sample is None:
            pm.last_error = o.error
            continue
        pm.last_error = None
        if pm.samples and o.sample.at <= pm.samples[-1].at:
            continue
        pm.last_ok = o.sample.at
        if pm.inflight_empty_at is None or o.sample.queue("inflight_queue") <= 0:
            pm.inflight_empty_at = o.sample.at
        pm.samples.append(o.sample)
        while pm.samples and o.sample.at - pm.samples[0].at > keep_seconds:
            pm.samples.popleft()
        if o.rooms is not None:
            pm.rooms.append((o.sample.at, working_rooms(o.rooms)))
        while pm.rooms and o.sample.at - pm.rooms[0][0] > keep_seconds:
            pm.rooms.popleft()
        # An effect older than every sample kept shifts them all alike: it changes no delta.
        while pm.canary_effects and pm.samples and pm.canary_effects[0][0] < pm.samples[0].at:
            pm.canary_effects.popleft()


def organic(
    samples: Sequence[Sample], effects: Sequence[tuple[float, Mapping[str, float]]]
) -> tuple[Sample, ...]:
    """The samples as the pod's own work moved them: every counter less what the canaries sent
    through it had added by then. Canaries are traffic pdwarden sent itself; subtracted here,
    no rule can ever read one as progress (a frozen pod plus canaries is still a frozen pod).

    A canary's increments are taken off from the first sample that shows them, not from the
    moment it ended: an engine may publish them a scrape later or in pieces (measured on the real
    vLLM pair under load: a canary's 32 transferred prompt tokens seen as 30, then 2), and taking
    them off early makes the counter dip and come back, which reads as movement (it hid a decode
    that recomputed every prompt for minutes). What a counter rose by, up to what canaries still
    owe it, is theirs; what they owe and nothing showed within SETTLE_SECONDS (or at the first
    sample after it, when scrapes failed meanwhile) is forgotten, so an increment that never
    comes cannot hide the pod's own progress for longer than that. A leg that was sent owes
    what it adds whether or not it was answered: a slow engine processes a leg whose deadline
    ran out all the same (measured: a busy decode's 32 transferred tokens per unanswered leg)."""
    if not effects:
        return tuple(samples)
    ordered = sorted(effects, key=lambda e: e[0])
    names = sorted({n for _, e in ordered for n in e if n in COUNTER_FIELDS})
    columns = {
        name: _organic_counter(
            [(s.at, getattr(s, name)) for s in samples],
            [(at, e[name]) for at, e in ordered if name in e],
        )
        for name in names
    }
    out = []
    for i, s in enumerate(samples):
        changes: dict[str, Any] = {n: v for n in names if (v := columns[n][i]) is not None}
        out.append(replace(s, **changes) if changes else s)
    return tuple(out)


def _organic_counter(
    values: Sequence[tuple[float, float | None]], effects: Sequence[tuple[float, float]]
) -> list[float | None]:
    """One counter's organic values (see `organic`); `effects` (end time, amount) in time order."""
    out: list[float | None] = []
    owed: list[list[float]] = []  # [end time, amount not yet seen]
    taken = 0.0
    last: float | None = None
    j = 0
    for at, raw in values:
        while j < len(effects) and effects[j][0] <= at:
            owed.append([effects[j][0], effects[j][1]])
            j += 1
        if raw is None:
            out.append(None)
            continue
        if last is None:  # the first sample: whatever ended before it shifts every sample alike
            take = sum(o[1] for o in owed)
        else:
            take = min(sum(o[1] for o in owed), max(raw - taken - last, 0.0))
        taken += take
        while take > 0 and owed:
            used = min(take, owed[0][1])
            owed[0][1] -= used
            take -= used
            if owed[0][1] <= 0:
                owed.pop(0)
        # Forgotten only once a sample taken SETTLE_SECONDS after it was offered what it owes:
        # a pod whose scrapes failed for a while shows it at the first sample that comes back.
        owed = [o for o in owed if at - o[0] <= SETTLE_SECONDS]
        last = raw - taken
        out.append(last)
    return out


def is_stale(pm: PodMemory, mono: float, interval: float) -> bool:
    """Stale: the last scrape failed, or the last good one is older than 2.5 intervals."""
    if pm.last_error is not None or pm.last_ok is None:
        return True
    return mono - pm.last_ok > STALE_AFTER_INTERVALS * interval


def attribute_peers(
    rooms: Sequence[RoomView], decode_ips: Mapping[str, str]
) -> tuple[RoomView, ...]:
    """Name each room's decode peer from the address the prefill verified, never from the
    peer's word: our decode pod at that IP, else the bare address (it matches no pod: judged
    gone, gets nobody cordoned); no verified address, no peer."""
    out = []
    for r in rooms:
        if r.peer_ip is None:
            out.append(replace(r, peer_pod=None, peer_incarnation=None))
        else:
            out.append(replace(r, peer_pod=decode_ips.get(r.peer_ip, r.peer_ip)))
    return tuple(out)


def pod_views(
    targets: Sequence[WorkerPod],
    observations: Mapping[str, Observation],
    mem: DeploymentMemory,
    mono: float,
    interval: float,
) -> list[PodView]:
    """What detection sees of each scraped pod: its recent history, rooms (peers named by
    verified address), and staleness."""
    decode_ips = {t.ip: t.name for t in targets if t.role == ROLE_DECODE}
    views = []
    for t in targets:
        pm = mem.pods.get(t.uid, PodMemory())
        o = observations.get(t.uid)
        rooms = None if o is None or o.rooms is None else attribute_peers(o.rooms, decode_ips)
        recent = tuple((at, attribute_peers(rs, decode_ips)) for at, rs in pm.rooms)
        views.append(
            PodView(
                name=t.name, role=t.role, uid=t.uid,
                history=organic(pm.samples, pm.canary_effects),
                rooms=rooms, recent_rooms=recent,
                stale=is_stale(pm, mono, interval) or o is None, error=pm.last_error,
                rooms_wait_for_decode_kv=t.rooms_wait_for_decode_kv,
                inflight_empty_at=pm.inflight_empty_at,
            )
        )  # fmt: skip
    return views


def stale_pods(pods: Sequence[Obj], views: Sequence[PodView]) -> set[str]:
    """Worker pods nobody may judge: stale views, and pods that exist but could not be scraped
    (no IP yet, not running, terminating)."""
    stale = {v.name for v in views if v.stale}
    scraped = {v.name for v in views}
    for pod in pods:
        name = str((pod.get("metadata") or {}).get("name") or "")
        if _role(pod) in WORKER_ROLES and name not in scraped:
            stale.add(name)
    return stale


def _condition(pod: Obj, type_: str) -> Obj | None:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if isinstance(c, Mapping) and c.get("type") == type_:
            return c
    return None


def decode_pod(pod: Obj, stale: bool, now: datetime) -> PodState:
    """A decode pod's serving state; one whose cordon time cannot be read counts as cordoned
    now (the safe reading: no restart is hurried, no uncordon is skipped)."""
    meta = pod.get("metadata") or {}
    serving = _condition(pod, CONDITION_SERVING)
    since = None
    if serving is not None and serving.get("status") == "False":
        raw = serving.get("lastTransitionTime")
        try:
            since = datetime.fromisoformat(str(raw).replace("Z", "+00:00")) if raw else now
        except ValueError:
            since = now
        if since.tzinfo is None:
            since = now
    ready = (_condition(pod, "Ready") or {}).get("status") == "True"
    return PodState(
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        ready=ready,
        cordoned_since=since,
        terminating=bool(meta.get("deletionTimestamp")),
        stale=stale,
    )


def decode_pods(
    pods: Sequence[Obj], stale: set[str], now: datetime, role: str = ROLE_DECODE
) -> list[PodState]:
    """The serving state of every pod of one role (decode by default; the SGLang prefill rung
    reads prefill pods the same way)."""
    out = []
    for p in pods:
        if _role(p) == role:
            name = str((p.get("metadata") or {}).get("name") or "")
            out.append(decode_pod(p, name in stale, now))
    return out


FindingKey = tuple[str, str, str]


def new_findings(
    first_seen: dict[FindingKey, datetime], detection: Detection, now: datetime
) -> list[Finding]:
    """Findings not seen in the previous cycle (announced once, keyed by `Finding.identity`,
    so a wedge whose suspects change is not announced again); `first_seen` is updated."""
    current = {f.identity: f for f in detection.findings}
    for key in list(first_seen):
        if key not in current:
            del first_seen[key]
    fresh = []
    for key, f in current.items():
        if key not in first_seen:
            first_seen[key] = now
            fresh.append(f)
    return fresh


def token_with_fallback(mem: DeploymentMemory, token: str | None) -> tuple[str | None, str | None]:
    """`token` as read now and the one it replaced, remembered in `mem` (until the next change
    or a restart of this process)."""
    if token and token != mem.admin_token:
        if mem.admin_token:
            mem.replaced_token = mem.admin_token
        mem.admin_token = token
    return token, (mem.replaced_token if mem.replaced_token != token else None)
