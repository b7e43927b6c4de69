"""The rungs of the repair ladder, one pure function each.

Why one function per rung: this is the part that can turn a wedge into an outage if it is wrong,
so each rung is a small function of the round's state (`Deciding`) and one finding or one pod,
named in the ladder (`ladder`, `Engine.prefill_rungs`) and unit-tested by that name. A rung adds
a `PlannedAction`, or a held-back line that says why not, or nothing while its last action
takes effect. The ladder and its safety envelope are described in `ladder`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Final

from pdwarden.engines.protocol import PrefillRung
from pdwarden.remediation.decide.actions import ActionKind, PlannedAction, PodState
from pdwarden.remediation.decide.deciding import Deciding
from pdwarden.remediation.decide.history import (
    decided_fail_rooms,
    failed_rooms_for,
    held_back_restart,
    last_action_on,
    restarted_since,
)
from pdwarden.remediation.detect.evidence import Finding

ROOM_WEDGES: Final = ("InflightStuck", "PeerIncarnationGone")  # findings that carry room ids


def fail_rooms(d: Deciding, f: Finding) -> None:
    """1. Fail wedged rooms on the prefill (they will never complete); a decode that wedged rooms
    point at again after their rooms were failed once becomes a repeat offender (rung 2)."""
    if f.reason not in ROOM_WEDGES or not f.rooms:
        return
    if d.dry_run and decided_fail_rooms(
        d.history, f.pod, f.peer, d.now - timedelta(seconds=d.spec.wedge_after_seconds)
    ):
        return  # DryRun failed nothing: the same wedge is still there and was reported
    if d.settling("FailRooms", f.pod):
        return
    repeat_window = d.now - timedelta(
        seconds=max(d.spec.restart_after_seconds, d.spec.cooldown_seconds)
    )
    if (
        f.peer
        and f.reason == "InflightStuck"
        and failed_rooms_for(d.history, f.peer, repeat_window, d.dry_run)
    ):
        d.repeat_offenders.add(f.peer)
    if (why_not := d.refusal("FailRooms", f"on {f.pod}")) is not None:
        d.held.append(why_not)
        return
    d.actions.append(
        PlannedAction("FailRooms", f.pod, f"{f.reason}: {f.evidence}", rooms=f.rooms,
                      room_count=f.room_count, peer=f.peer)
    )  # fmt: skip


def next_prefill_step(d: Deciding, f: Finding) -> tuple[ActionKind, str | None] | None:
    """1a/1b for a wedged prefill without a rooms API: AbortRequests, then (opt-in)
    RestartPrefill if it is still wedged restartAfterSeconds after the abort, its queue never
    seen empty since; None while the last one takes effect. The second element is extra reason
    text, or "held: why" when the step may not run now. An abort older than restartAfterSeconds
    + wedgeAfterSeconds, or one that emptied the queue (the finding's rooms held for less time
    than the abort is old), is a finished repair: a wedge after that starts again at 1a."""
    last = last_action_on(d.history, f.pod, d.dry_run)
    age = (d.now - last.time).total_seconds() if last is not None else math.inf
    if age < d.spec.cooldown_seconds:
        return None  # the effect of the last action is not visible yet
    restart_after = d.spec.restart_after_seconds
    if last is not None and last.action == "RestartPrefill" and age < restart_after:
        return None  # wait for the new pod
    if last is None or last.action != "AbortRequests":
        return "AbortRequests", None
    if age < restart_after:
        return None
    if age > restart_after + d.spec.wedge_after_seconds:
        return "AbortRequests", "; the last abort was a finished repair, this is a new wedge"
    if f.oldest_seconds is not None and f.oldest_seconds < age:
        # Its queue was seen empty after the abort: the abort worked, these rooms came since
        # (seen on the real SGLang pair: rooms a decode stranded on the prefill, aborted, then
        # more stranded by that decode's next death; restarting the prefill helped nobody).
        return "AbortRequests", (
            f"; its queue was empty after the last abort ({age:.0f}s ago), holding rooms again "
            f"for {f.oldest_seconds:.0f}s: a new wedge"
        )
    if busy := d.prefills_busy(f.pod):
        return "RestartPrefill", f"held: prefill pod(s) {', '.join(busy)} not ready yet"
    return "RestartPrefill", f"; still wedged {age:.0f}s after aborting its requests"


def abort_requests(d: Deciding, f: Finding) -> None:
    """1a/1b (stock SGLang: no rooms API, so findings carry no room ids): abort every request of
    the wedged prefill pod, SGLang's only way to free wedged rooms (what it cost goes to the
    ledger), then restart it if that did not help (`next_prefill_step`)."""
    if f.rooms:
        fail_rooms(d, f)
        return
    if f.pod in d.prefill_acted:
        return
    d.prefill_acted.add(f.pod)
    step = next_prefill_step(d, f)
    if step is None or d.settling(step[0], f.pod):
        return
    kind, why = step
    if (why_not := d.refusal(kind, f"on {f.pod}")) is not None:
        d.held.append(why_not)
    elif why is not None and why.startswith("held: "):
        d.held.append(f"{kind} on {f.pod}: {why.removeprefix('held: ')}")
    else:
        d.actions.append(
            PlannedAction(kind, f.pod, f"{f.reason}: {f.evidence}" + (why or ""),
                          uid=d.prefill_uid(f.pod), room_count=f.room_count)
        )  # fmt: skip


def prefill_restart_refusal(d: Deciding, name: str | None, suspects: int = 0) -> str | None:
    """Why prefill `name` may not be restarted now, or None to restart it ("" when the last
    restart is still taking effect: nothing to report)."""
    peer = next((p for p in d.prefills if p.name == name), None)
    if peer is None:
        return f"the prefill is not known ({suspects} suspects)"
    last = last_action_on(d.history, peer.name, d.dry_run)
    wait = max(d.spec.restart_after_seconds, d.spec.cooldown_seconds)
    if last is not None and (d.now - last.time).total_seconds() < wait:
        return ""  # the last action on it (a restart) is still taking effect
    if peer.stale:
        return "its metrics are stale"
    if peer.terminating or not peer.ready:
        return ""  # restarting already
    if busy := d.prefills_busy(peer.name):
        return f"prefill pod(s) {', '.join(busy)} not ready yet"
    return None


def _restart_prefill(d: Deciding, name: str, f: Finding, reason: str, peer: str | None) -> None:
    """Restart prefill `name` once this round, unless refused (the shared part of 1v and 1p)."""
    if name in d.prefill_acted:
        return
    d.prefill_acted.add(name)
    why_not = prefill_restart_refusal(d, name, len(f.suspects))
    if why_not == "" or d.settling("RestartPrefill", name):
        return
    if (refused := d.refusal("RestartPrefill", f"on {name}")) is not None:
        d.held.append(refused)
    elif why_not is not None:
        d.held.append(f"RestartPrefill on {name}: {why_not}")
    else:
        d.actions.append(
            PlannedAction("RestartPrefill", name, reason, uid=d.prefill_uid(name), peer=peer)
        )


def restart_read_peer(d: Deciding, f: Finding) -> None:
    """1v (engines whose decode pulls the KV: vLLM): restart the one prefill a decode's stuck
    read waits on (the only prefill not proven alive). Deleting it ends the read; with
    kv_load_failure_policy recompute the decode recomputes the request instead of failing it."""
    if f.peer is None:
        return
    _restart_prefill(d, f.peer, f, f"KVReadStuck on {f.pod}: {f.evidence}", f.pod)


def restart_prefill(d: Deciding, f: Finding) -> None:
    """1p (engines with a pair canary: vLLM): restart a prefill a pair canary found dead (its
    leg got no answer while its own counters stood still: PrefillDead), the same checks as 1v."""
    _restart_prefill(d, f.pod, f, f"{f.reason}: {f.evidence}", None)


def restart_failing_prefill(d: Deciding, f: Finding) -> None:
    """1t (SGLang): restart a prefill whose KV transfers keep failing while both sides of its
    pair answer, once pair canaries confirmed it (TransfersFailing, `decide.pairs`: canary after
    canary moved no KV while both health checks answered); the same checks as 1v. The prefill
    is the side restarted: SGLang 0.5.23's decode drops a prefill's cached connection after any
    failed send or waiting timeout and asks its bootstrap server again (disaggregation/common/
    conn.py `invalidate_cached_bootstrap_infos`), while the prefill's NIXL agent keeps what it
    learnt of its decodes (nixl/conn.py reloads a peer it holds and removes none), and in the
    one public report of pairs stuck this way over NIXL (vLLM's, after decodes came back on the
    same addresses) only restarting the prefills healed them. An unconfirmed finding is
    reported and never acts."""
    if f.confirmed:
        _restart_prefill(d, f.pod, f, f"{f.reason}: {f.evidence}", f.peer)


PREFILL_RUNGS: Final[Mapping[PrefillRung, Callable[[Deciding, Finding], None]]] = {
    "fail_rooms": fail_rooms,
    "abort_requests": abort_requests,
    "restart_read_peer": restart_read_peer,
    "restart_prefill": restart_prefill,
    "restart_failing_prefill": restart_failing_prefill,
}


def cordon_decode(d: Deciding, pod: PodState) -> None:
    """2. Take a stalled decode out of service (readiness gate False), or one wedged rooms point
    at again after their rooms were failed; a decode a canary confirmed dead (2v) serves nobody,
    so it counts neither as serving nor against maxUnavailableDecode."""
    name, dead = pod.name, pod.name in d.dead
    stalled = name in d.detection.stalled_decodes
    if not (stalled or name in d.repeat_offenders):
        return
    if dead:
        why = f"engine frozen, {d.canary_says(name)}"
    elif stalled:
        why = "decode stalled"
    else:
        why = "wedged rooms point at it again after their rooms were failed"
    if (refused := d.refusal("CordonDecode", name)) is not None:
        d.held.append(refused)
    elif d.cooling(name):
        d.held.append(f"CordonDecode {name}: in cooldown after the last action")
    elif not dead and d.budget_left() <= 0:
        d.held.append(f"CordonDecode {name}: budget of {d.budget} unavailable decode pods used up")
    elif not dead and d.serving_left() <= 1:
        d.held.append(f"CordonDecode {name}: it is the last serving decode pod")
    else:
        d.actions.append(PlannedAction("CordonDecode", name, why, uid=pod.uid))


def restart_decode(d: Deciding, pod: PodState, since: datetime) -> None:
    """3. Delete a cordoned decode that still makes no progress restartAfterSeconds after the
    cordon; its StatefulSet recreates it. A restart a PodDisruptionBudget held back is retried
    after cooldownSeconds."""
    name = pod.name
    waited = (d.now - since).total_seconds()
    if waited < d.spec.restart_after_seconds:
        return
    cooldown = timedelta(seconds=d.spec.cooldown_seconds)
    if (refused := d.refusal("RestartDecode", name)) is not None:
        d.held.append(refused)
    elif restarted_since(d.history, name, since, d.dry_run):
        return  # already restarted during this cordon: wait for the new pod
    elif (held := held_back_restart(d.history, name, d.dry_run)) and d.now - held.time < cooldown:
        d.held.append(
            f"RestartDecode {name}: held back ({held.reason}); retried after cooldownSeconds"
        )
    else:
        still = f"still dead, {d.canary_says(name)}" if name in d.dead else "still stalled"
        d.actions.append(
            PlannedAction("RestartDecode", name, f"cordoned {waited:.0f}s ago and {still}",
                          uid=pod.uid)
        )  # fmt: skip


def uncordon_decode(d: Deciding, pod: PodState) -> None:
    """4. Put a cordoned decode back when its stall has cleared (healthy for a full window)."""
    name = pod.name
    if (
        name not in d.detection.healthy_decodes
        or name in d.detection.implicated_decodes()
        or d.cooling(name)
    ):
        return
    why = "healthy for a full window"
    if name in d.detection.canaries:
        why += f"; {d.canary_says(name)}"
    d.actions.append(PlannedAction("UncordonDecode", name, why, uid=pod.uid))


def decode_rung(d: Deciding, pod: PodState) -> None:
    """Rungs 2-4 for one decode pod, whichever applies to its state."""
    if (
        pod.stale
        or pod.terminating
        or (pod.name in d.unsettled and d.settling("Acting on", pod.name))
    ):
        return
    since = d.cordoned_since(pod)
    if since is None:
        cordon_decode(d, pod)
    elif pod.name in d.detection.stalled_decodes:
        restart_decode(d, pod, since)
    else:
        uncordon_decode(d, pod)
