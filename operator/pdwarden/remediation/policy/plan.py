"""Remediation policy: findings + spec + ledger + pod states -> the actions to take now.

Why pure: this is the part that can turn a wedge into an outage if it is wrong, so it is a
function of plain data with no clock and no client, unit-tested case by case. The ladder:

1. FailRooms: fail wedged rooms on the prefill side (they will never complete).
2. CordonDecode: take a decode pod out of service (readiness gate False) when it is stalled, or
   when wedged rooms point at it again after their rooms were already failed once (repeat).
3. RestartDecode: delete a cordoned decode pod that still makes no progress restartAfterSeconds
   after the cordon; its StatefulSet recreates it.
4. UncordonDecode: put a cordoned pod back when its stall has cleared.

On stock SGLang (no rooms API, so findings carry no room ids) rung 1 is replaced per prefill pod:

1a. AbortRequests: abort every request of the wedged prefill pod (SGLang's only way to free
    wedged rooms; it costs every request the pod holds, which the ledger records).
1b. RestartPrefill (opt-in): delete that prefill pod when it is still, or again, wedged
    restartAfterSeconds after the abort; at most one prefill pod restarting at a time. An abort
    older than restartAfterSeconds + wedgeAfterSeconds is a finished repair: a wedge after that
    starts the ladder again at 1a.

On stock vLLM (the decode PULLS the KV; no rooms API; abort by request id only under
--enable-scale-out, which pdwarden does not render) a decode's read stuck on a frozen prefill
(KVReadStuck, detect/pull.py) has one repair vLLM supports:

1v. RestartPrefill (opt-in, as for SGLang): delete the one prefill pod the finding names as its
    peer (the only prefill not proven alive); never when it is stale, already restarting, or
    another prefill is not ready; then nothing for restartAfterSeconds (or the cooldown, if
    longer) while the new pod starts. Deleting the prefill ends the decode's read
    (NIXL_ERR_REMOTE_DISCONNECT); with kv_load_failure_policy recompute the decode recomputes
    the request instead of failing it. LateNotification is reported only.

A decode whose engine froze behind its live API server shows nothing on its own metrics
(running = waiting = 0: requests never reach its scheduler) and answers /health 200 (vLLM 0.32
AsyncLLM.check_health, v1/engine/async_llm.py:1089, fails only once the engine core died); only
a prefill's LeaseExpired shows it, naming as suspects the decodes whose token counter did not
move (detect/pull.py). So on vLLM the cycle asks each suspect, and each decode cordoned by us,
for one token (remediation.confirm.canary: GET /v1/models, which the API server answers from
its configuration without the engine, entrypoints/openai/models/serving.py:64; then a one-token
completion under a deadline; folded in by policy.canary) before this plan runs:

2v. A decode the canary confirms dead is stalled for rungs 2-4: CordonDecode, then RestartDecode
    restartAfterSeconds after the cordon while it stays dead. One it finds alive again is
    uncordoned as before (healthy for a full window); alive and unknown never start anything.
    A confirmed-dead decode serves nobody, so it counts neither as serving (it is cordoned even
    when it is the last ready decode) nor against maxUnavailableDecode (cordoning it takes no
    capacity away, and it does not use up the budget of the others).

Safety envelope: mode Off/DryRun/Enforce; at most maxUnavailableDecode decode pods cordoned or
not ready, and never the last ready one (rung 2v says why a confirmed-dead decode is neither);
a cooldown per pod; a circuit breaker on actions per hour; never an action on, or attributed
to, a pod whose metrics are stale.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from pdwarden.api import LedgerEntry, RemediationSpec
from pdwarden.api.status import LedgerAction
from pdwarden.remediation.detect.evidence import Finding
from pdwarden.remediation.detect.rules import Detection

ActionKind = LedgerAction  # the plan's actions are exactly what the ledger records
HOUR = timedelta(hours=1)
PREFILL_WEDGES = frozenset({"InflightStuck", "PeerIncarnationGone", "InflightGaugeStuck"})
ENGINES_WITHOUT_ROOMS = frozenset({"sglang"})
PULL_ENGINES = frozenset({"vllm"})  # the decode reads the KV from the prefill (detect/pull.py)


@dataclass(frozen=True)
class DecodePod:
    """A worker pod's serving state as the API server shows it (decode; prefill for SGLang)."""

    name: str
    uid: str
    ready: bool
    cordoned_since: datetime | None = None  # serving condition False since (set by us)
    terminating: bool = False
    stale: bool = False


@dataclass(frozen=True)
class Action:
    kind: ActionKind
    pod: str
    reason: str
    uid: str = ""
    rooms: tuple[int, ...] = ()
    room_count: int = 0
    peer: str | None = None


@dataclass(frozen=True)
class Plan:
    actions: tuple[Action, ...] = ()
    suspended: bool = False
    budget: int = 0
    held_back: tuple[str, ...] = ()  # decisions not taken, and why
    dry_run: bool = False


def decode_budget(spec: RemediationSpec, decode_replicas: int) -> int:
    value = spec.max_unavailable_decode
    if isinstance(value, str):
        return math.floor(decode_replicas * int(value.rstrip("%")) / 100)
    return int(value)


def actions_in_last_hour(
    history: Sequence[LedgerEntry], now: datetime, dry_run: bool, reset_at: datetime | None
) -> int:
    since = now - HOUR
    if reset_at is not None and reset_at > since:
        since = reset_at
    return sum(
        1
        for e in history
        if e.time > since
        and e.dry_run == dry_run
        and e.outcome != "Skipped"
        and e.action != "UncordonDecode"
    )


@dataclass(frozen=True)
class Breaker:
    """The circuit breaker over a ledger: actions counted this hour, and whether it is open."""

    used: int
    limit: int

    @property
    def open(self) -> bool:
        return self.used >= self.limit


def breaker(
    history: Sequence[LedgerEntry],
    now: datetime,
    *,
    dry_run: bool,
    reset_at: datetime | None,
    limit: int,
) -> Breaker:
    """The one place the breaker's state is computed (for the plan and for the status)."""
    return Breaker(actions_in_last_hour(history, now, dry_run, reset_at), limit)


def _last_action_on(history: Sequence[LedgerEntry], pod: str, dry_run: bool) -> LedgerEntry | None:
    for entry in reversed(history):
        if entry.pod == pod and entry.dry_run == dry_run and entry.outcome != "Failed":
            return entry
    return None


def _virtual_cordon(history: Sequence[LedgerEntry], pod: str) -> datetime | None:
    """In DryRun nothing is cordoned: the time of the recorded decision stands in for it, through
    the DryRun restart decided during it, until a DryRun uncordon (the pod was healthy for a full
    window). So a stalled pod's cordon and restart are each reported once per wedge, not again
    every restartAfterSeconds."""
    for e in reversed(history):
        if e.pod != pod or not e.dry_run or e.outcome == "Failed":
            continue
        if e.action == "CordonDecode":
            return e.time
        if e.action == "UncordonDecode":
            return None
    return None


def cordoned_at(d: DecodePod, history: Sequence[LedgerEntry], dry_run: bool) -> datetime | None:
    """Since when the plan counts `d` cordoned: the pod's own state, or in DryRun the recorded
    decision standing in for it (`_virtual_cordon`)."""
    return _virtual_cordon(history, d.name) if dry_run else d.cordoned_since


def _failed_rooms_for(
    history: Sequence[LedgerEntry], peer: str, since: datetime, dry_run: bool
) -> bool:
    return any(
        e.action == "FailRooms"
        and e.peer == peer
        and e.time >= since
        and e.dry_run == dry_run
        and e.outcome != "Pending"  # not known to have happened: no evidence against the peer
        for e in history
    )


def _decided_fail_rooms(
    history: Sequence[LedgerEntry], pod: str, peer: str | None, since: datetime
) -> bool:
    return any(
        e.action == "FailRooms" and e.dry_run and (e.pod, e.peer) == (pod, peer) and e.time >= since
        for e in history
    )


def _restarted_since(
    history: Sequence[LedgerEntry], pod: str, since: datetime, dry_run: bool
) -> bool:
    """A restart that went through (one held back by a PodDisruptionBudget, Skipped, did not)."""
    return any(
        e.pod == pod
        and e.action == "RestartDecode"
        and e.outcome == "Succeeded"
        and e.dry_run == dry_run
        and e.time >= since
        for e in history
    )


def _held_back_restart(
    history: Sequence[LedgerEntry], pod: str, dry_run: bool
) -> LedgerEntry | None:
    """The pod's last action, if it is a restart that was held back (Skipped)."""
    last = _last_action_on(history, pod, dry_run)
    return last if last and last.action == "RestartDecode" and last.outcome == "Skipped" else None


def _prefill_rung(
    spec: RemediationSpec,
    f: Finding,
    *,
    history: Sequence[LedgerEntry],
    now: datetime,
    dry_run: bool,
    prefills: Sequence[DecodePod],
) -> tuple[ActionKind, str | None] | None:
    """The next rung for a wedged SGLang prefill pod, or None while the last one takes effect.

    The second element is extra reason text, or "held: why" when the rung may not run now.
    """
    last = _last_action_on(history, f.pod, dry_run)
    age = (now - last.time).total_seconds() if last is not None else math.inf
    if age < spec.cooldown_seconds:
        return None  # the effect of the last action is not visible yet
    restart_after = spec.restart_after_seconds
    if last is not None and last.action == "RestartPrefill" and age < restart_after:
        return None  # wait for the new pod
    if last is None or last.action != "AbortRequests":
        return "AbortRequests", None
    if age < restart_after:
        return None
    if age > restart_after + spec.wedge_after_seconds:
        return "AbortRequests", "; the last abort was a finished repair, this is a new wedge"
    busy = [p.name for p in prefills if p.name != f.pod and (p.terminating or not p.ready)]
    if busy:
        return "RestartPrefill", f"held: prefill pod(s) {', '.join(busy)} not ready yet"
    return "RestartPrefill", f"; still wedged {age:.0f}s after aborting its requests"


def _stuck_read_rung(
    spec: RemediationSpec,
    f: Finding,
    *,
    history: Sequence[LedgerEntry],
    now: datetime,
    dry_run: bool,
    prefills: Sequence[DecodePod],
) -> str | None:
    """Rung 1v for a vLLM decode's stuck read: None to restart its peer prefill now, else why
    not ("" when the last restart is still taking effect: nothing to report)."""
    peer = next((p for p in prefills if p.name == f.peer), None)
    if peer is None:
        return f"the read's prefill is not known ({len(f.suspects)} suspects)"
    last = _last_action_on(history, peer.name, dry_run)
    wait = max(spec.restart_after_seconds, spec.cooldown_seconds)
    if last is not None and (now - last.time).total_seconds() < wait:
        return ""  # the last action on it (a restart) is still taking effect
    if peer.stale:
        return "its metrics are stale"
    if peer.terminating or not peer.ready:
        return ""  # restarting already
    busy = [p.name for p in prefills if p.name != peer.name and (p.terminating or not p.ready)]
    if busy:
        return f"prefill pod(s) {', '.join(busy)} not ready yet"
    return None


def plan(
    spec: RemediationSpec,
    detection: Detection,
    decodes: Sequence[DecodePod],
    history: Sequence[LedgerEntry],
    now: datetime,
    *,
    decode_replicas: int,
    breaker_reset_at: datetime | None = None,
    engine: str = "pdworker",
    prefills: Sequence[DecodePod] = (),
) -> Plan:
    """Decide this round's actions. Nothing here performs them.

    `prefills` are the prefill pods (only the SGLang prefill rungs read them).
    """
    dry_run = spec.mode == "DryRun"
    budget = decode_budget(spec, decode_replicas)
    if spec.mode == "Off":
        return Plan(budget=budget)
    state = breaker(
        history, now, dry_run=dry_run, reset_at=breaker_reset_at, limit=spec.max_actions_per_hour
    )
    used = state.used
    allowed = set(spec.actions)
    actions: list[Action] = []
    held: list[str] = []
    by_name = {d.name: d for d in decodes}
    cooldown = timedelta(seconds=spec.cooldown_seconds)

    def breaker_open() -> bool:
        # Actions planned this round count too, so one round cannot overshoot the limit.
        planned = sum(1 for a in actions if a.kind != "UncordonDecode")
        return used + planned >= spec.max_actions_per_hour

    def cooling(pod: str) -> bool:
        last = _last_action_on(history, pod, dry_run)
        return last is not None and now - last.time < cooldown

    # A pod with a Pending entry (a replica died while acting on it) gets nothing new until the
    # entry is settled from what the pod shows: acting first would make the settling read our
    # own action as the dead replica's, and count one action twice or lose one.
    unsettled = {e.pod: e for e in history if e.outcome == "Pending" and e.dry_run == dry_run}

    def settling(kind: str, pod: str) -> bool:
        e = unsettled.get(pod)
        if e is not None:
            held.append(f"{kind} {pod}: waiting for the outcome of {e.action}, still Pending")
        return e is not None

    def cordoned_since(d: DecodePod) -> datetime | None:
        return cordoned_at(d, history, dry_run)

    # Confirmed dead by a canary this cycle (rung 2v): serving nobody, whatever readiness says.
    dead = detection.dead_decodes

    def budget_left() -> int:
        out = {d.name for d in decodes if cordoned_since(d) or not d.ready or d.terminating}
        out |= {a.pod for a in actions if a.kind == "CordonDecode"}
        return budget - len(out - dead)

    def serving_left() -> int:
        cordoning = {a.pod for a in actions if a.kind == "CordonDecode"}
        return sum(
            1
            for d in decodes
            if d.ready
            and not cordoned_since(d)
            and not d.terminating
            and d.name not in cordoning
            and d.name not in dead
        )

    def canary_says(name: str) -> str:
        return f"canary: {detection.canaries[name].detail}" if name in detection.canaries else ""

    # 1. Fail wedged rooms on prefill.
    repeat_window = now - timedelta(seconds=max(spec.restart_after_seconds, spec.cooldown_seconds))
    repeat_offenders: set[str] = set()
    decided_since = now - timedelta(seconds=spec.wedge_after_seconds)
    prefill_acted: set[str] = set()
    for f in detection.findings:
        if engine in PULL_ENGINES and f.reason == "KVReadStuck":
            if f.peer is None or f.peer in prefill_acted:
                continue
            prefill_acted.add(f.peer)
            why_not = _stuck_read_rung(
                spec, f, history=history, now=now, dry_run=dry_run, prefills=prefills
            )
            if why_not == "" or settling("RestartPrefill", f.peer):
                continue
            if "RestartPrefill" not in allowed:
                held.append(f"RestartPrefill on {f.peer}: not in spec.remediation.actions")
            elif breaker_open():
                held.append(
                    f"RestartPrefill on {f.peer}: remediation suspended by the circuit breaker"
                )
            elif why_not is not None:
                held.append(f"RestartPrefill on {f.peer}: {why_not}")
            else:
                uid = next((p.uid for p in prefills if p.name == f.peer), "")
                actions.append(
                    Action("RestartPrefill", f.peer,
                           f"KVReadStuck on {f.pod}: {f.evidence}", uid=uid, peer=f.pod)
                )  # fmt: skip
            continue
        if engine in ENGINES_WITHOUT_ROOMS and f.reason in PREFILL_WEDGES and not f.rooms:
            if f.pod not in prefill_acted:
                prefill_acted.add(f.pod)
                step = _prefill_rung(
                    spec, f, history=history, now=now, dry_run=dry_run, prefills=prefills
                )
                if step is not None and not settling(step[0], f.pod):
                    kind, why = step
                    if kind not in allowed:
                        held.append(f"{kind} on {f.pod}: not in spec.remediation.actions")
                    elif breaker_open():
                        held.append(
                            f"{kind} on {f.pod}: remediation suspended by the circuit breaker"
                        )
                    elif why is not None and why.startswith("held: "):
                        held.append(f"{kind} on {f.pod}: {why.removeprefix('held: ')}")
                    else:
                        uid = next((p.uid for p in prefills if p.name == f.pod), "")
                        actions.append(
                            Action(kind, f.pod, f"{f.reason}: {f.evidence}" + (why or ""),
                                   uid=uid, room_count=f.room_count)
                        )  # fmt: skip
            continue
        if f.reason not in ("InflightStuck", "PeerIncarnationGone") or not f.rooms:
            continue
        if dry_run and _decided_fail_rooms(history, f.pod, f.peer, decided_since):
            continue  # DryRun failed nothing: the same wedge is still there and was reported
        if settling("FailRooms", f.pod):
            continue
        if (
            f.peer
            and f.reason == "InflightStuck"
            and _failed_rooms_for(history, f.peer, repeat_window, dry_run)
        ):
            repeat_offenders.add(f.peer)
        if "FailRooms" not in allowed:
            held.append(f"FailRooms on {f.pod}: not in spec.remediation.actions")
        elif breaker_open():
            held.append(f"FailRooms on {f.pod}: remediation suspended by the circuit breaker")
        else:
            actions.append(
                Action("FailRooms", f.pod, f"{f.reason}: {f.evidence}", rooms=f.rooms,
                       room_count=f.room_count, peer=f.peer)
            )  # fmt: skip

    # 2-4. Decode pods: cordon, restart, uncordon.
    for name in sorted(by_name):
        d = by_name[name]
        if d.stale or d.terminating or (name in unsettled and settling("Acting on", name)):
            continue
        stalled = name in detection.stalled_decodes
        since = cordoned_since(d)
        if since is None:
            if not (stalled or name in repeat_offenders):
                continue
            if name in dead:
                why = f"engine frozen, {canary_says(name)}"
            elif stalled:
                why = "decode stalled"
            else:
                why = "wedged rooms point at it again after their rooms were failed"
            if "CordonDecode" not in allowed:
                held.append(f"CordonDecode {name}: not in spec.remediation.actions")
            elif breaker_open():
                held.append(f"CordonDecode {name}: remediation suspended by the circuit breaker")
            elif cooling(name):
                held.append(f"CordonDecode {name}: in cooldown after the last action")
            elif name not in dead and budget_left() <= 0:
                held.append(
                    f"CordonDecode {name}: budget of {budget} unavailable decode pods used up"
                )
            elif name not in dead and serving_left() <= 1:
                held.append(f"CordonDecode {name}: it is the last serving decode pod")
            else:
                actions.append(Action("CordonDecode", name, why, uid=d.uid))
            continue
        if stalled:
            waited = (now - since).total_seconds()
            if waited < spec.restart_after_seconds:
                continue
            if "RestartDecode" not in allowed:
                held.append(f"RestartDecode {name}: not in spec.remediation.actions")
            elif breaker_open():
                held.append(f"RestartDecode {name}: remediation suspended by the circuit breaker")
            elif _restarted_since(history, name, since, dry_run):
                continue  # already restarted during this cordon: wait for the new pod
            elif (
                held_restart := _held_back_restart(history, name, dry_run)
            ) is not None and now - held_restart.time < cooldown:
                held.append(f"RestartDecode {name}: held back ({held_restart.reason}); retried "
                            f"after cooldownSeconds")  # fmt: skip
            else:
                still = f"still dead, {canary_says(name)}" if name in dead else "still stalled"
                actions.append(
                    Action("RestartDecode", name, f"cordoned {waited:.0f}s ago and {still}",
                           uid=d.uid)
                )  # fmt: skip
        elif (
            name in detection.healthy_decodes
            and name not in detection.implicated_decodes()
            and not cooling(name)
        ):
            why = "healthy for a full window"
            if name in detection.canaries:
                why += f"; {canary_says(name)}"
            actions.append(Action("UncordonDecode", name, why, uid=d.uid))
    return Plan(
        actions=tuple(actions),
        suspended=state.open,
        budget=budget,
        held_back=tuple(held),
        dry_run=dry_run,
    )
