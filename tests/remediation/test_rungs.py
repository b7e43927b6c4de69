"""remediation.decide.rungs, rung by rung: each function driven directly with a hand-built round.

Each test is named after the rung it drives and builds the round (`Deciding`) by hand: the
findings, the decode and prefill pods, the ledger, the budget and the breaker's count. A rung adds
a PlannedAction, a held-back line that says why not, or nothing while its last action takes
effect; each test asserts which, exactly. `now` is fixed, so every age is exact. The ladder as a
whole (`plan()`) is tested in test_remediation_policy.py and the engine-specific policy files;
the last test here checks only that `plan()` picks the prefill rung from the engine's data.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any, get_args

import pytest

from pdwarden.api import LedgerEntry, RemediationSpec
from pdwarden.engines.protocol import PrefillRung
from pdwarden.remediation.decide import PlannedAction, PodState, plan
from pdwarden.remediation.decide.deciding import Deciding
from pdwarden.remediation.decide.rungs import (
    PREFILL_RUNGS,
    abort_requests,
    cordon_decode,
    decode_rung,
    fail_rooms,
    next_prefill_step,
    prefill_restart_refusal,
    restart_decode,
    restart_failing_prefill,
    restart_prefill,
    restart_read_peer,
    uncordon_decode,
)
from pdwarden.remediation.detect.evidence import Finding
from pdwarden.remediation.detect.rules import Detection
from pdwarden.values import CanaryResult

NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
ALL = ["FailRooms", "CordonDecode", "RestartDecode", "AbortRequests", "RestartPrefill"]
RESTART_AFTER, WEDGE_AFTER, COOLDOWN = 120, 45, 30
DEAD = "no token within 30s while its API server answers /v1/models"
BREAKER = "remediation suspended by the circuit breaker"
NOT_ALLOWED = "not in spec.remediation.actions"


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


def pod(name: str, cordoned: float | None = None, ready: bool = True, **flags: bool) -> PodState:
    """A pod; `cordoned`: seconds since pdwarden cordoned it (then not Ready: the gate)."""
    since = ago(cordoned) if cordoned is not None else None
    return PodState(name, f"uid-{name}", ready=ready and since is None, cordoned_since=since,
                    **flags)  # fmt: skip


def entry(action: str, p: str, seconds_ago: float, **kw: Any) -> LedgerEntry:
    return LedgerEntry(time=ago(seconds_ago), action=action, pod=p, **kw)


def deciding(
    *findings: Finding,
    stalled: Iterable[str] = (),
    healthy: Iterable[str] = (),
    dead: Iterable[str] = (),
    alive: Iterable[str] = (),
    decodes: list[PodState] | None = None,
    prefills: list[PodState] | None = None,
    history: Iterable[LedgerEntry] = (),
    budget: int = 2,
    used: int = 0,
    **spec: Any,
) -> Deciding:
    """One round: decodes d-0..d-3 and prefills p-0, p-1 all Ready unless given; `dead` and
    `alive` are canary verdicts (a dead decode is stalled too, as verdicts.with_verdicts makes
    it); `used` is the breaker's count before the round; Pending entries are unsettled."""
    spec.setdefault("actions", ALL)
    spec.setdefault("restart_after_seconds", RESTART_AFTER)
    spec.setdefault("wedge_after_seconds", WEDGE_AFTER)
    spec.setdefault("cooldown_seconds", COOLDOWN)
    remediation = RemediationSpec(**spec)
    canaries = {n: CanaryResult(n, "dead", DEAD) for n in dead}
    canaries |= {n: CanaryResult(n, "alive", "answered one token") for n in alive}
    detection = Detection(
        tuple(findings),
        stalled_decodes=frozenset(stalled) | frozenset(dead),
        healthy_decodes=frozenset(healthy),
        canaries=canaries,
    )
    ledger = list(history)
    dry_run = remediation.mode == "DryRun"
    return Deciding(
        remediation, detection,
        [pod(f"d-{i}") for i in range(4)] if decodes is None else decodes,
        [pod("p-0"), pod("p-1")] if prefills is None else prefills,
        ledger, NOW, budget, used,
        unsettled={e.pod: e for e in ledger if e.outcome == "Pending" and e.dry_run == dry_run},
    )  # fmt: skip


def stuck(peer: str = "d-1", rooms: tuple[int, ...] = (11, 12)) -> Finding:
    return Finding(
        pod="p-0", role="prefill", reason="InflightStuck", rooms=rooms, room_count=len(rooms),
        oldest_seconds=75.0, peer=peer, evidence=f"{len(rooms)} rooms in the inflight queue",
    )  # fmt: skip


def gauge_stuck(p: str = "p-0", held: float = 200.0) -> Finding:
    """A wedged prefill of an engine without a rooms API: no room ids; its queue has held rooms
    for `held` seconds (since before any abort of these tests, unless said otherwise)."""
    return Finding(
        pod=p, role="prefill", reason="InflightGaugeStuck", room_count=3, oldest_seconds=held,
        evidence="inflight queue >= 3 for 70s",
    )  # fmt: skip


def read_stuck(peer: str | None = "p-0", suspects: tuple[str, ...] = ("p-0",)) -> Finding:
    return Finding(
        pod="d-0", role="decode", reason="KVReadStuck", room_count=1, oldest_seconds=50.0,
        peer=peer, suspects=suspects, evidence="1 KV reads in flight for 50s",
    )  # fmt: skip


def kinds(d: Deciding) -> list[tuple[str, str]]:
    return [(a.kind, a.pod) for a in d.actions]


# -- 1. fail_rooms -------------------------------------------------------------------------


def test_fail_rooms_fails_the_wedged_rooms_on_the_prefill() -> None:
    d = deciding()
    fail_rooms(d, stuck())
    assert d.actions == [
        PlannedAction("FailRooms", "p-0", "InflightStuck: 2 rooms in the inflight queue",
                      rooms=(11, 12), room_count=2, peer="d-1"),
    ]  # fmt: skip
    assert d.held == [] and d.repeat_offenders == set()


def test_fail_rooms_ignores_findings_without_room_ids() -> None:
    d = deciding()
    fail_rooms(d, stuck(rooms=()))
    fail_rooms(d, gauge_stuck())
    assert d.actions == [] and d.held == []


def test_fail_rooms_is_held_when_not_allowed_or_when_the_breaker_is_open() -> None:
    d = deciding(actions=["CordonDecode", "RestartDecode"])
    fail_rooms(d, stuck())
    assert d.actions == [] and d.held == [f"FailRooms on p-0: {NOT_ALLOWED}"]
    d = deciding(used=20, max_actions_per_hour=20)
    fail_rooms(d, stuck())
    assert d.actions == [] and d.held == [f"FailRooms on p-0: {BREAKER}"]


def test_fail_rooms_marks_a_decode_whose_rooms_were_failed_before_a_repeat_offender() -> None:
    d = deciding(history=[entry("FailRooms", "p-0", 100, peer="d-1")])
    fail_rooms(d, stuck("d-1"))
    assert d.repeat_offenders == {"d-1"}
    assert kinds(d) == [("FailRooms", "p-0")]
    # Outside max(restartAfterSeconds, cooldownSeconds) it is a new wedge, not a repeat.
    d = deciding(history=[entry("FailRooms", "p-0", RESTART_AFTER + 1, peer="d-1")])
    fail_rooms(d, stuck("d-1"))
    assert d.repeat_offenders == set()


def test_fail_rooms_waits_for_a_pending_entry_on_the_prefill_to_settle() -> None:
    d = deciding(history=[entry("FailRooms", "p-0", 5, peer="d-1", outcome="Pending")])
    fail_rooms(d, stuck())
    assert d.actions == []
    assert d.held == ["FailRooms p-0: waiting for the outcome of FailRooms, still Pending"]


def test_fail_rooms_in_dry_run_reports_the_same_wedge_once() -> None:
    decided = entry("FailRooms", "p-0", 20, peer="d-1", dry_run=True)
    d = deciding(history=[decided], mode="DryRun")
    fail_rooms(d, stuck("d-1"))
    assert d.actions == [] and d.held == []
    # Older than wedgeAfterSeconds: the wedge is reported again.
    older = entry("FailRooms", "p-0", WEDGE_AFTER + 1, peer="d-1", dry_run=True)
    d = deciding(history=[older], mode="DryRun")
    fail_rooms(d, stuck("d-1"))
    assert kinds(d) == [("FailRooms", "p-0")]


# -- 1a/1b. next_prefill_step and abort_requests -----------------------------------------------


def test_next_prefill_step_aborts_first() -> None:
    assert next_prefill_step(deciding(), gauge_stuck()) == ("AbortRequests", None)


def test_next_prefill_step_waits_out_the_cooldown_and_a_restart() -> None:
    assert next_prefill_step(deciding(history=[entry("AbortRequests", "p-0", 10)]),
                             gauge_stuck()) is None  # fmt: skip
    restarting = deciding(history=[entry("RestartPrefill", "p-0", RESTART_AFTER - 1)])
    assert next_prefill_step(restarting, gauge_stuck()) is None
    restarted = deciding(history=[entry("RestartPrefill", "p-0", RESTART_AFTER + 1)])
    assert next_prefill_step(restarted, gauge_stuck()) == ("AbortRequests", None)


def test_next_prefill_step_restarts_restart_after_seconds_after_the_abort() -> None:
    early = deciding(history=[entry("AbortRequests", "p-0", RESTART_AFTER - 1)])
    assert next_prefill_step(early, gauge_stuck()) is None
    d = deciding(history=[entry("AbortRequests", "p-0", 130)])
    assert next_prefill_step(d, gauge_stuck()) == (
        "RestartPrefill", "; still wedged 130s after aborting its requests",
    )  # fmt: skip


def test_an_abort_that_emptied_the_queue_was_a_finished_repair() -> None:
    """Rooms held for less time than the abort is old: the queue was seen empty after the abort,
    so these rooms came since (on the real SGLang pair: a decode's second death stranding new
    ones) and the ladder starts again with an abort, never a restart of a prefill it freed."""
    d = deciding(history=[entry("AbortRequests", "p-0", 130)])
    assert next_prefill_step(d, gauge_stuck(held=62)) == (
        "AbortRequests",
        "; its queue was empty after the last abort (130s ago), holding rooms again for 62s: a "
        "new wedge",
    )  # fmt: skip
    assert next_prefill_step(d, gauge_stuck(held=160))[0] == "RestartPrefill"  # type: ignore[index]


def test_next_prefill_step_holds_a_restart_while_another_prefill_is_not_ready() -> None:
    d = deciding(history=[entry("AbortRequests", "p-0", 130)],
                 prefills=[pod("p-0"), pod("p-1", ready=False)])  # fmt: skip
    assert next_prefill_step(d, gauge_stuck()) == (
        "RestartPrefill", "held: prefill pod(s) p-1 not ready yet",
    )  # fmt: skip


def test_next_prefill_step_starts_again_after_a_finished_repair() -> None:
    d = deciding(history=[entry("AbortRequests", "p-0", RESTART_AFTER + WEDGE_AFTER + 1)])
    assert next_prefill_step(d, gauge_stuck()) == (
        "AbortRequests", "; the last abort was a finished repair, this is a new wedge",
    )  # fmt: skip


def test_abort_requests_aborts_every_request_of_a_wedged_prefill() -> None:
    d = deciding()
    abort_requests(d, gauge_stuck())
    assert d.actions == [
        PlannedAction("AbortRequests", "p-0", "InflightGaugeStuck: inflight queue >= 3 for 70s",
                      uid="uid-p-0", room_count=3),
    ]  # fmt: skip
    assert d.held == []


def test_abort_requests_acts_once_per_prefill_a_round() -> None:
    d = deciding()
    abort_requests(d, gauge_stuck())
    abort_requests(d, gauge_stuck())
    assert kinds(d) == [("AbortRequests", "p-0")]


def test_abort_requests_fails_rooms_when_the_finding_names_them() -> None:
    d = deciding()
    abort_requests(d, stuck())
    assert kinds(d) == [("FailRooms", "p-0")]


def test_abort_requests_is_held_when_not_allowed_or_when_the_breaker_is_open() -> None:
    d = deciding(actions=["CordonDecode", "RestartDecode"])
    abort_requests(d, gauge_stuck())
    assert d.actions == [] and d.held == [f"AbortRequests on p-0: {NOT_ALLOWED}"]
    d = deciding(used=20, max_actions_per_hour=20)
    abort_requests(d, gauge_stuck())
    assert d.actions == [] and d.held == [f"AbortRequests on p-0: {BREAKER}"]


def test_abort_requests_restarts_the_prefill_when_the_abort_did_not_help() -> None:
    d = deciding(history=[entry("AbortRequests", "p-0", 130)])
    abort_requests(d, gauge_stuck())
    assert d.actions == [
        PlannedAction(
            "RestartPrefill", "p-0",
            "InflightGaugeStuck: inflight queue >= 3 for 70s; still wedged 130s after aborting "
            "its requests", uid="uid-p-0", room_count=3,
        ),
    ]  # fmt: skip


def test_abort_requests_holds_the_restart_while_another_prefill_is_not_ready() -> None:
    d = deciding(history=[entry("AbortRequests", "p-0", 130)],
                 prefills=[pod("p-0"), pod("p-1", ready=False)])  # fmt: skip
    abort_requests(d, gauge_stuck())
    assert d.actions == []
    assert d.held == ["RestartPrefill on p-0: prefill pod(s) p-1 not ready yet"]


def test_abort_requests_waits_for_a_pending_entry_on_the_prefill_to_settle() -> None:
    d = deciding(history=[entry("AbortRequests", "p-0", 200, outcome="Pending")])
    abort_requests(d, gauge_stuck())
    assert d.actions == []
    assert d.held == ["AbortRequests p-0: waiting for the outcome of AbortRequests, still Pending"]


def _refusal(d: Deciding, f: Finding) -> str | None:
    """prefill_restart_refusal for the prefill a stuck read waits on."""
    return prefill_restart_refusal(d, f.peer, len(f.suspects))


# -- 1v/1p. prefill_restart_refusal, restart_read_peer and restart_prefill ---------------


def test_prefill_restart_refusal_is_none_for_a_ready_peer() -> None:
    assert _refusal(deciding(), read_stuck()) is None


def test_prefill_restart_refusal_names_why_not() -> None:
    unknown = read_stuck(peer=None, suspects=("p-0", "p-1"))
    assert _refusal(deciding(), unknown) == "the prefill is not known (2 suspects)"
    stale = deciding(prefills=[pod("p-0", stale=True), pod("p-1")])
    assert _refusal(stale, read_stuck()) == "its metrics are stale"
    busy = deciding(prefills=[pod("p-0"), pod("p-1", ready=False)])
    assert _refusal(busy, read_stuck()) == "prefill pod(s) p-1 not ready yet"


def test_prefill_restart_refusal_is_silent_while_the_peer_restarts() -> None:
    recent = deciding(history=[entry("RestartPrefill", "p-0", RESTART_AFTER - 1)])
    assert _refusal(recent, read_stuck()) == ""
    for p0 in (pod("p-0", ready=False), pod("p-0", terminating=True)):
        assert _refusal(deciding(prefills=[p0, pod("p-1")]), read_stuck()) == ""


def prefill_dead(pod_name: str = "p-0") -> Finding:
    return Finding(pod=pod_name, role="prefill", reason="PrefillDead",
                   evidence="pair canary with d-0: prefill leg: no answer within 8s")  # fmt: skip


def test_restart_prefill_restarts_a_prefill_a_pair_canary_found_dead_once() -> None:
    d = deciding()
    restart_prefill(d, prefill_dead())
    restart_read_peer(d, read_stuck())  # the same prefill, also a stuck read's peer: once
    assert d.actions == [
        PlannedAction("RestartPrefill", "p-0",
                      "PrefillDead: pair canary with d-0: prefill leg: no answer within 8s",
                      uid="uid-p-0"),
    ]  # fmt: skip


def test_restart_prefill_is_refused_like_1v() -> None:
    d = deciding(actions=["CordonDecode", "RestartDecode"])
    restart_prefill(d, prefill_dead())
    assert d.actions == [] and d.held == [f"RestartPrefill on p-0: {NOT_ALLOWED}"]
    d = deciding(prefills=[pod("p-0"), pod("p-1", ready=False)])
    restart_prefill(d, prefill_dead())
    assert d.held == ["RestartPrefill on p-0: prefill pod(s) p-1 not ready yet"]
    recent = deciding(history=[entry("RestartPrefill", "p-0", RESTART_AFTER - 1)])
    restart_prefill(recent, prefill_dead())
    assert recent.actions == [] and recent.held == []


def test_plan_restarts_a_dead_prefill_only_on_an_engine_whose_ladder_has_rung_1p() -> None:
    finding = prefill_dead()
    for engine, expected in (("vllm", [("RestartPrefill", "p-0")]), ("pdworker", []),
                             ("sglang", [("RestartPrefill", "p-0")])):  # fmt: skip
        d = deciding(finding)
        got = plan(d.spec, d.detection, d.decodes, d.history, d.now, decode_replicas=2,
                   engine=engine, prefills=d.prefills)  # fmt: skip
        assert [(a.kind, a.pod) for a in got.actions] == expected, engine


def failing(confirmed: bool) -> Finding:
    return Finding(
        pod="p-0", role="prefill", reason="TransfersFailing", peer="d-0", confirmed=confirmed,
        evidence="12 KV transfers failed at 6 scrapes in 45s and none succeeded",
    )  # fmt: skip


def test_restart_failing_prefill_acts_only_once_pair_canaries_confirmed_it() -> None:
    """1t: a suspicion (client aborts count as failures too) is reported, never acted on."""
    d = deciding()
    restart_failing_prefill(d, failing(confirmed=False))
    assert d.actions == [] and d.held == []
    restart_failing_prefill(d, failing(confirmed=True))
    assert d.actions == [
        PlannedAction("RestartPrefill", "p-0", "TransfersFailing: 12 KV transfers failed at 6 "
                      "scrapes in 45s and none succeeded", uid="uid-p-0", peer="d-0"),
    ]  # fmt: skip


def test_restart_failing_prefill_is_refused_like_1v_and_only_sglang_has_it() -> None:
    d = deciding(actions=["AbortRequests"])
    restart_failing_prefill(d, failing(confirmed=True))
    assert d.actions == [] and d.held == [f"RestartPrefill on p-0: {NOT_ALLOWED}"]
    recent = deciding(history=[entry("RestartPrefill", "p-0", RESTART_AFTER - 1)])
    restart_failing_prefill(recent, failing(confirmed=True))
    assert recent.actions == [] and recent.held == []
    for engine, expected in (("sglang", [("RestartPrefill", "p-0")]), ("vllm", []),
                             ("pdworker", [])):  # fmt: skip
        d = deciding(failing(confirmed=True))
        got = plan(d.spec, d.detection, d.decodes, d.history, d.now, decode_replicas=2,
                   engine=engine, prefills=d.prefills)  # fmt: skip
        assert [(a.kind, a.pod) for a in got.actions] == expected, engine


def test_restart_read_peer_restarts_the_prefill_a_stuck_read_waits_on() -> None:
    d = deciding()
    restart_read_peer(d, read_stuck())
    restart_read_peer(d, read_stuck())  # a second stuck read on the same peer: once
    assert d.actions == [
        PlannedAction("RestartPrefill", "p-0", "KVReadStuck on d-0: 1 KV reads in flight for 50s",
                      uid="uid-p-0", peer="d-0"),
    ]  # fmt: skip
    assert d.held == []


def test_restart_read_peer_does_nothing_without_a_single_peer() -> None:
    d = deciding()
    restart_read_peer(d, read_stuck(peer=None, suspects=("p-0", "p-1")))
    assert d.actions == [] and d.held == []


def test_restart_read_peer_is_held_for_a_stale_peer() -> None:
    d = deciding(prefills=[pod("p-0", stale=True), pod("p-1")])
    restart_read_peer(d, read_stuck())
    assert d.actions == [] and d.held == ["RestartPrefill on p-0: its metrics are stale"]


def test_restart_read_peer_is_held_when_not_allowed_or_when_the_breaker_is_open() -> None:
    d = deciding(actions=["CordonDecode", "RestartDecode"])
    restart_read_peer(d, read_stuck())
    assert d.actions == [] and d.held == [f"RestartPrefill on p-0: {NOT_ALLOWED}"]
    d = deciding(used=20, max_actions_per_hour=20)
    restart_read_peer(d, read_stuck())
    assert d.actions == [] and d.held == [f"RestartPrefill on p-0: {BREAKER}"]


def test_restart_read_peer_waits_for_a_pending_entry_on_the_peer_to_settle() -> None:
    d = deciding(history=[entry("RestartPrefill", "p-0", RESTART_AFTER + 1, outcome="Pending")])
    restart_read_peer(d, read_stuck())
    assert d.actions == []
    assert d.held == [
        "RestartPrefill p-0: waiting for the outcome of RestartPrefill, still Pending"
    ]


# -- 2. cordon_decode ----------------------------------------------------------------------


def test_cordon_decode_cordons_a_stalled_decode() -> None:
    d = deciding(stalled=["d-1"])
    cordon_decode(d, pod("d-1"))
    assert d.actions == [PlannedAction("CordonDecode", "d-1", "decode stalled", uid="uid-d-1")]


def test_cordon_decode_leaves_a_decode_that_is_neither_stalled_nor_a_repeat_offender() -> None:
    d = deciding()
    cordon_decode(d, pod("d-1"))
    assert d.actions == [] and d.held == []


def test_cordon_decode_cordons_a_repeat_offender() -> None:
    d = deciding()
    d.repeat_offenders.add("d-1")
    cordon_decode(d, pod("d-1"))
    assert d.actions == [
        PlannedAction(
            "CordonDecode", "d-1", "wedged rooms point at it again after their rooms were failed",
            uid="uid-d-1",
        ),
    ]  # fmt: skip


def test_cordon_decode_is_held_when_not_allowed_or_when_the_breaker_is_open() -> None:
    d = deciding(stalled=["d-1"], actions=["FailRooms"])
    cordon_decode(d, pod("d-1"))
    assert d.actions == [] and d.held == [f"CordonDecode d-1: {NOT_ALLOWED}"]
    d = deciding(stalled=["d-1"], used=20, max_actions_per_hour=20)
    cordon_decode(d, pod("d-1"))
    assert d.actions == [] and d.held == [f"CordonDecode d-1: {BREAKER}"]


def test_cordon_decode_is_held_in_cooldown() -> None:
    d = deciding(stalled=["d-1"], history=[entry("UncordonDecode", "d-1", COOLDOWN - 1)])
    cordon_decode(d, pod("d-1"))
    assert d.actions == [] and d.held == ["CordonDecode d-1: in cooldown after the last action"]


def test_cordon_decode_is_held_when_the_budget_is_used_up() -> None:
    decodes = [pod("d-0", cordoned=10), pod("d-1"), pod("d-2"), pod("d-3")]
    d = deciding(stalled=["d-0", "d-1"], decodes=decodes, budget=1)
    cordon_decode(d, pod("d-1"))
    assert d.actions == []
    assert d.held == ["CordonDecode d-1: budget of 1 unavailable decode pods used up"]


def test_cordon_decode_never_cordons_the_last_serving_decode() -> None:
    decodes = [pod("d-0"), pod("d-1", ready=False)]
    d = deciding(stalled=["d-0"], decodes=decodes)
    cordon_decode(d, decodes[0])
    assert d.actions == [] and d.held == ["CordonDecode d-0: it is the last serving decode pod"]


def test_cordon_decode_cordons_a_confirmed_dead_decode_even_as_the_last_serving_one() -> None:
    decodes = [pod("d-0"), pod("d-1", ready=False)]
    d = deciding(dead=["d-0"], decodes=decodes, budget=1)  # d-1 not ready: budget used up too
    cordon_decode(d, decodes[0])
    assert d.actions == [
        PlannedAction("CordonDecode", "d-0", f"engine frozen, canary: {DEAD}", uid="uid-d-0"),
    ]
    assert d.held == []


# -- 3. restart_decode ---------------------------------------------------------------------


def test_restart_decode_waits_restart_after_seconds_after_the_cordon() -> None:
    d = deciding(stalled=["d-0"])
    restart_decode(d, pod("d-0", cordoned=RESTART_AFTER - 1), ago(RESTART_AFTER - 1))
    assert d.actions == [] and d.held == []


def test_restart_decode_restarts_after_restart_after_seconds() -> None:
    d = deciding(stalled=["d-0"])
    restart_decode(d, pod("d-0", cordoned=130), ago(130))
    assert d.actions == [
        PlannedAction("RestartDecode", "d-0", "cordoned 130s ago and still stalled", uid="uid-d-0"),
    ]


def test_restart_decode_says_a_dead_decode_is_still_dead() -> None:
    d = deciding(dead=["d-0"])
    restart_decode(d, pod("d-0", cordoned=130), ago(130))
    assert [a.reason for a in d.actions] == [f"cordoned 130s ago and still dead, canary: {DEAD}"]


def test_restart_decode_is_held_when_not_allowed_or_when_the_breaker_is_open() -> None:
    d = deciding(stalled=["d-0"], actions=["CordonDecode"])
    restart_decode(d, pod("d-0", cordoned=130), ago(130))
    assert d.actions == [] and d.held == [f"RestartDecode d-0: {NOT_ALLOWED}"]
    d = deciding(stalled=["d-0"], used=20, max_actions_per_hour=20)
    restart_decode(d, pod("d-0", cordoned=130), ago(130))
    assert d.actions == [] and d.held == [f"RestartDecode d-0: {BREAKER}"]


def test_restart_decode_restarts_once_per_cordon() -> None:
    d = deciding(stalled=["d-0"], history=[entry("RestartDecode", "d-0", 5)])
    restart_decode(d, pod("d-0", cordoned=130), ago(130))
    assert d.actions == [] and d.held == []


def test_restart_decode_held_by_a_pdb_is_retried_after_the_cooldown() -> None:
    held = entry("RestartDecode", "d-0", COOLDOWN - 1, outcome="Skipped",
                 reason="PodDisruptionBudget demo-decode allows no disruption")  # fmt: skip
    d = deciding(stalled=["d-0"], history=[held])
    restart_decode(d, pod("d-0", cordoned=130), ago(130))
    assert d.actions == []
    assert d.held == [
        "RestartDecode d-0: held back (PodDisruptionBudget demo-decode allows no disruption); "
        "retried after cooldownSeconds"
    ]
    older = held.model_copy(update={"time": ago(COOLDOWN + 1)})
    d = deciding(stalled=["d-0"], history=[older])
    restart_decode(d, pod("d-0", cordoned=130), ago(130))
    assert kinds(d) == [("RestartDecode", "d-0")]


# -- 4. uncordon_decode --------------------------------------------------------------------


def test_uncordon_decode_uncordons_a_decode_healthy_for_a_full_window() -> None:
    d = deciding(healthy=["d-0"])
    uncordon_decode(d, pod("d-0", cordoned=200))
    assert d.actions == [
        PlannedAction("UncordonDecode", "d-0", "healthy for a full window", uid="uid-d-0")
    ]


def test_uncordon_decode_says_what_the_canary_found() -> None:
    d = deciding(healthy=["d-0"], alive=["d-0"])
    uncordon_decode(d, pod("d-0", cordoned=200))
    assert [a.reason for a in d.actions] == [
        "healthy for a full window; canary: answered one token"
    ]


def test_uncordon_decode_needs_evidence_of_health_and_no_cooldown() -> None:
    for d in (
        deciding(),  # no evidence at all
        deciding(stuck("d-0"), healthy=["d-0"]),  # wedged rooms wait on it
        deciding(healthy=["d-0"], history=[entry("CordonDecode", "d-0", COOLDOWN - 1)]),
    ):
        uncordon_decode(d, pod("d-0", cordoned=COOLDOWN - 1))
        assert d.actions == [] and d.held == []


# -- 2-4. decode_rung ----------------------------------------------------------------------


def test_decode_rung_picks_the_rung_from_the_pods_state() -> None:
    decodes = [pod("d-0"), pod("d-1", cordoned=130), pod("d-2", cordoned=200), pod("d-3")]
    d = deciding(stalled=["d-0", "d-1"], healthy=["d-2", "d-3"], decodes=decodes, budget=3)
    for p in decodes:
        decode_rung(d, p)
    assert kinds(d) == [
        ("CordonDecode", "d-0"), ("RestartDecode", "d-1"), ("UncordonDecode", "d-2"),
    ]  # fmt: skip


@pytest.mark.parametrize("flag", ["stale", "terminating"])
def test_decode_rung_leaves_a_stale_or_terminating_decode_alone(flag: str) -> None:
    p = pod("d-0", cordoned=130, **{flag: True})
    d = deciding(stalled=["d-0"], decodes=[p, pod("d-1"), pod("d-2")])
    decode_rung(d, p)
    assert d.actions == [] and d.held == []


def test_decode_rung_waits_for_a_pending_entry_on_the_decode_to_settle() -> None:
    d = deciding(stalled=["d-0"], history=[entry("CordonDecode", "d-0", 5, outcome="Pending")])
    decode_rung(d, pod("d-0"))
    assert d.actions == []
    assert d.held == ["Acting on d-0: waiting for the outcome of CordonDecode, still Pending"]


def test_decode_rung_in_dry_run_reads_the_recorded_cordon_and_restart_once() -> None:
    """Nothing is cordoned in DryRun: the recorded cordon stands in for it, and the recorded
    restart is reported once, not again every restartAfterSeconds."""
    cordon = entry("CordonDecode", "d-0", 300, dry_run=True)
    d = deciding(stalled=["d-0"], history=[cordon], mode="DryRun")
    decode_rung(d, pod("d-0"))
    assert kinds(d) == [("RestartDecode", "d-0")]
    restart = entry("RestartDecode", "d-0", 170, dry_run=True)
    d = deciding(stalled=["d-0"], history=[cordon, restart], mode="DryRun")
    decode_rung(d, pod("d-0"))
    assert d.actions == [] and d.held == []


# -- plan(): the prefill rung is the engine's ------------------------------------------------


@pytest.mark.parametrize(
    ("engine", "expected"), [("pdworker", []), ("vllm", [("RestartPrefill", "p-0")])]
)
def test_plan_picks_the_prefill_rung_from_the_engines_prefill_rungs(
    engine: str, expected: list[tuple[str, str]]
) -> None:
    spec = RemediationSpec(actions=ALL, restart_after_seconds=RESTART_AFTER,
                           wedge_after_seconds=WEDGE_AFTER, cooldown_seconds=COOLDOWN)  # fmt: skip
    decodes = [pod("d-0"), pod("d-1")]
    p = plan(
        spec, Detection((read_stuck(),)), decodes, [], NOW, decode_replicas=2, engine=engine,
        prefills=[pod("p-0"), pod("p-1")],
    )  # fmt: skip
    assert [(a.kind, a.pod) for a in p.actions] == expected
    assert p.held_back == ()


def test_every_rung_name_has_exactly_one_function() -> None:
    """`PrefillRung` (engines/protocol.py) names the rungs an engine may pick; `PREFILL_RUNGS`
    (rungs.py) holds their functions: the two never drift apart."""
    assert set(PREFILL_RUNGS) == set(get_args(PrefillRung))
