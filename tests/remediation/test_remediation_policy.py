"""remediation.plan: each rung of the ladder and each safety rule, case by case.

The ledger entries are what a previous cycle (or a previous operator process) recorded; `now`
is fixed, so every age below is exact.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from pdwarden.api import LedgerEntry, RemediationSpec
from pdwarden.remediation.decide import (
    Plan,
    PlannedAction,
    PodState,
    actions_in_last_hour,
    decode_budget,
    plan,
)
from pdwarden.remediation.detect.evidence import Finding
from pdwarden.remediation.detect.rules import Detection

NOW = datetime(2025, 6, 1, 12, 0, 0, tzinfo=UTC)


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


def spec(**kw: Any) -> RemediationSpec:
    kw.setdefault("max_unavailable_decode", 2)
    return RemediationSpec(**kw)


def pods(n: int = 4, cordoned: dict[str, float] | None = None, **flags: set[str]) -> list[PodState]:
    """Decode pods d-0..d-(n-1); cordoned maps name -> seconds since the cordon; flags are the
    sets of pods that are not_ready, stale or terminating."""
    out = []
    for i in range(n):
        name = f"d-{i}"
        since = (cordoned or {}).get(name)
        out.append(
            PodState(
                name, f"uid-{name}",
                ready=name not in flags.get("not_ready", set()) and since is None,
                cordoned_since=ago(since) if since is not None else None,
                terminating=name in flags.get("terminating", set()),
                stale=name in flags.get("stale", set()),
            )
        )  # fmt: skip
    return out


def entry(
    action: str, pod: str, seconds_ago: float, peer: str | None = None, **kw: Any
) -> LedgerEntry:
    return LedgerEntry(time=ago(seconds_ago), action=action, pod=pod, peer=peer, **kw)


def stuck(peer: str = "d-1", rooms: tuple[int, ...] = (11, 12), pod: str = "p-0") -> Finding:
    return Finding(
        pod=pod, role="prefill", reason="InflightStuck", rooms=rooms, room_count=len(rooms),
        oldest_seconds=75.0, peer=peer, evidence=f"{len(rooms)} rooms in the inflight queue",
    )  # fmt: skip


def gone(peer: str = "d-1", rooms: tuple[int, ...] = (21,)) -> Finding:
    return Finding(
        pod="p-0", role="prefill", reason="PeerIncarnationGone", rooms=rooms,
        room_count=len(rooms), peer=peer, evidence="rooms wait on a gone incarnation",
    )  # fmt: skip


def stalled(*names: str) -> Detection:
    findings = tuple(
        Finding(pod=n, role="decode", reason="DecodeStalled", room_count=2, evidence="flat")
        for n in names
    )
    return Detection(findings, (), frozenset(names))


def detection(*findings: Finding, stalled_decodes: Iterable[str] = ()) -> Detection:
    extra = stalled(*stalled_decodes)
    return Detection(findings + extra.findings, (), extra.stalled_decodes)


def run(
    det: Detection,
    decodes: list[PodState] | None = None,
    history: list[LedgerEntry] | None = None,
    reset_at: datetime | None = None,
    **kw: Any,
) -> Plan:
    decodes = pods() if decodes is None else decodes
    return plan(
        spec(**kw), det, decodes, history or [], NOW,
        decode_replicas=len(decodes), breaker_reset_at=reset_at,
    )  # fmt: skip


def kinds(p: Plan) -> list[tuple[str, str]]:
    return [(a.kind, a.pod) for a in p.actions]


# -- 1. FailRooms --------------------------------------------------------------------------


def test_fail_rooms_for_wedged_rooms() -> None:
    p = run(detection(stuck("d-1", (11, 12)), gone("d-3", (21,))))
    assert p.actions == (
        PlannedAction("FailRooms", "p-0", "InflightStuck: 2 rooms in the inflight queue",
               rooms=(11, 12), room_count=2, peer="d-1"),
        PlannedAction("FailRooms", "p-0", "PeerIncarnationGone: rooms wait on a gone incarnation",
               rooms=(21,), room_count=1, peer="d-3"),
    )  # fmt: skip
    assert not p.dry_run and not p.suspended and p.held_back == ()


def test_a_first_wedge_does_not_cordon_its_decode_peer() -> None:
    assert kinds(run(detection(stuck("d-1")))) == [("FailRooms", "p-0")]


def test_gauge_only_findings_have_no_rooms_to_fail() -> None:
    f = Finding(pod="p-0", role="prefill", reason="InflightGaugeStuck", room_count=3)
    assert run(Detection((f,))).actions == ()


def test_nothing_to_do() -> None:
    assert run(Detection()) == Plan(budget=2)


# -- 2. CordonDecode -----------------------------------------------------------------------


def test_cordon_a_stalled_decode() -> None:
    p = run(detection(stalled_decodes=["d-2"]))
    assert p.actions == (PlannedAction("CordonDecode", "d-2", "decode stalled", uid="uid-d-2"),)


def test_cordon_a_repeat_offender_after_its_rooms_were_failed_once() -> None:
    history = [entry("FailRooms", "p-0", 40, peer="d-1", rooms=2)]
    p = run(detection(stuck("d-1")), history=history)
    assert kinds(p) == [("FailRooms", "p-0"), ("CordonDecode", "d-1")]
    assert "again" in p.actions[1].reason


def test_old_failed_rooms_do_not_make_a_repeat_offender() -> None:
    history = [entry("FailRooms", "p-0", 3600, peer="d-1", rooms=2)]
    assert kinds(run(detection(stuck("d-1")), history=history)) == [("FailRooms", "p-0")]


def test_a_gone_incarnation_is_never_a_repeat_offender() -> None:
    history = [entry("FailRooms", "p-0", 40, peer="d-1", rooms=2)]
    assert kinds(run(detection(gone("d-1")), history=history)) == [("FailRooms", "p-0")]


def test_healthy_decodes_are_left_alone() -> None:
    assert run(detection(stuck("d-1")), decodes=pods(4)).actions[1:] == ()


# -- 3. RestartDecode ----------------------------------------------------------------------


def test_restart_only_after_restart_after_seconds() -> None:
    history = [entry("CordonDecode", "d-1", 30)]
    assert run(stalled("d-1"), pods(cordoned={"d-1": 30}), history).actions == ()
    history = [entry("CordonDecode", "d-1", 61)]
    p = run(stalled("d-1"), pods(cordoned={"d-1": 61}), history)
    assert p.actions == (
        PlannedAction("RestartDecode", "d-1", "cordoned 61s ago and still stalled", uid="uid-d-1"),
    )


def test_restart_only_if_still_stalled() -> None:
    history = [entry("CordonDecode", "d-1", 300)]
    p = run(detection(stuck("d-1")), pods(cordoned={"d-1": 300}), history)
    assert kinds(p) == [("FailRooms", "p-0")]  # implicated, not stalled: neither rung


def test_never_restart_twice_per_cordon() -> None:
    history = [entry("CordonDecode", "d-1", 300), entry("RestartDecode", "d-1", 200)]
    assert run(stalled("d-1"), pods(cordoned={"d-1": 300}), history).actions == ()


def test_a_failed_restart_is_tried_again() -> None:
    history = [
        entry("CordonDecode", "d-1", 300),
        entry("RestartDecode", "d-1", 200, outcome="Failed"),
    ]
    assert kinds(run(stalled("d-1"), pods(cordoned={"d-1": 300}), history)) == [
        ("RestartDecode", "d-1")
    ]


def test_a_new_cordon_allows_a_new_restart() -> None:
    """The restarted pod stalled again and was cordoned again: the ladder starts over."""
    history = [
        entry("CordonDecode", "d-1", 900),
        entry("RestartDecode", "d-1", 800),
        entry("CordonDecode", "d-1", 100),
    ]
    assert kinds(run(stalled("d-1"), pods(cordoned={"d-1": 100}), history)) == [
        ("RestartDecode", "d-1")
    ]


# -- 4. UncordonDecode ---------------------------------------------------------------------


HEALTHY_D1 = Detection(healthy_decodes=frozenset({"d-1"}))


def test_uncordon_when_recovered() -> None:
    history = [entry("CordonDecode", "d-1", 120)]
    p = run(HEALTHY_D1, pods(cordoned={"d-1": 120}), history)
    assert p.actions == (
        PlannedAction("UncordonDecode", "d-1", "healthy for a full window", uid="uid-d-1"),
    )


def test_no_uncordon_without_a_full_window_of_evidence() -> None:
    """A restarted operator has no samples yet: silence is not recovery."""
    history = [entry("CordonDecode", "d-1", 120)]
    assert run(Detection(), pods(cordoned={"d-1": 120}), history).actions == ()


def test_no_uncordon_while_wedged_rooms_still_point_at_it() -> None:
    history = [entry("CordonDecode", "d-1", 120)]
    assert kinds(run(detection(stuck("d-1")), pods(cordoned={"d-1": 120}), history)) == [
        ("FailRooms", "p-0")
    ]


def test_no_uncordon_within_the_cooldown_of_the_cordon() -> None:
    """A repeat offender is not stalled; one scrape later it must not be uncordoned already."""
    history = [entry("FailRooms", "p-0", 45, peer="d-1"), entry("CordonDecode", "d-1", 5)]
    assert run(HEALTHY_D1, pods(cordoned={"d-1": 5}), history).actions == ()
    assert kinds(run(HEALTHY_D1, pods(cordoned={"d-1": 61}), history[:1])) == [
        ("UncordonDecode", "d-1")
    ]


# -- budget --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "replicas", "budget"),
    [(0, 4, 0), (1, 4, 1), (3, 2, 3), ("25%", 4, 1), ("25%", 7, 1), ("25%", 3, 0),
     ("50%", 5, 2), ("99%", 10, 9), ("0%", 10, 0), ("10%", 0, 0)],
)  # fmt: skip
def test_decode_budget_count_or_percent_rounded_down(
    value: int | str, replicas: int, budget: int
) -> None:
    assert decode_budget(spec(max_unavailable_decode=value), replicas) == budget


def test_budget_as_a_count() -> None:
    p = run(stalled("d-0", "d-1", "d-2"), pods(6), max_unavailable_decode=2)
    assert kinds(p) == [("CordonDecode", "d-0"), ("CordonDecode", "d-1")]
    assert p.held_back == ("CordonDecode d-2: budget of 2 unavailable decode pods used up",)


def test_budget_as_a_percent_rounds_down() -> None:
    p = run(stalled("d-0", "d-1"), pods(7), max_unavailable_decode="25%")  # 1.75 -> 1
    assert kinds(p) == [("CordonDecode", "d-0")] and p.budget == 1
    p = run(stalled("d-0"), pods(3), max_unavailable_decode="25%")  # 0.75 -> 0
    assert p.actions == () and "budget of 0" in p.held_back[0]


def test_budget_counts_cordoned_and_not_ready_pods() -> None:
    history = [entry("CordonDecode", "d-0", 10)]
    decodes = pods(8, cordoned={"d-0": 10}, not_ready={"d-1"})
    p = run(stalled("d-0", "d-2"), decodes, history, max_unavailable_decode=2)
    assert p.actions == ()
    assert p.held_back == ("CordonDecode d-2: budget of 2 unavailable decode pods used up",)


def test_last_serving_decode_is_protected() -> None:
    p = run(stalled("d-0", "d-1"), pods(2), max_unavailable_decode=5)
    assert kinds(p) == [("CordonDecode", "d-0")]
    assert p.held_back == ("CordonDecode d-1: it is the last serving decode pod",)
    p = run(stalled("d-1"), pods(2, not_ready={"d-0"}), max_unavailable_decode=5)
    assert p.actions == () and "last serving" in p.held_back[0]


# -- cooldown ------------------------------------------------------------------------------


def test_cooldown_after_the_last_action_on_a_pod() -> None:
    history = [entry("UncordonDecode", "d-1", 30)]
    p = run(stalled("d-1"), history=history, cooldown_seconds=60)
    assert p.actions == ()
    assert p.held_back == ("CordonDecode d-1: in cooldown after the last action",)
    history = [entry("UncordonDecode", "d-1", 61)]
    assert kinds(run(stalled("d-1"), history=history, cooldown_seconds=60)) == [
        ("CordonDecode", "d-1")
    ]


def test_a_failed_action_does_not_start_the_cooldown() -> None:
    history = [entry("CordonDecode", "d-1", 5, outcome="Failed")]
    assert kinds(run(stalled("d-1"), history=history)) == [("CordonDecode", "d-1")]


def test_cooldown_is_per_pod() -> None:
    history = [entry("UncordonDecode", "d-1", 5)]
    assert kinds(run(stalled("d-1", "d-2"), history=history)) == [("CordonDecode", "d-2")]


# -- circuit breaker -----------------------------------------------------------------------


def busy_hour(n: int, **kw: Any) -> list[LedgerEntry]:
    return [entry("FailRooms", f"p-{i}", 60 + i, peer="d-9", **kw) for i in range(n)]


def test_breaker_trips_at_max_actions_per_hour() -> None:
    p = run(detection(stuck("d-1")), history=busy_hour(19), max_actions_per_hour=20)
    assert kinds(p) == [("FailRooms", "p-0")] and not p.suspended
    p = run(detection(stuck("d-1"), stalled_decodes=["d-2"]), history=busy_hour(20),
            max_actions_per_hour=20)  # fmt: skip
    assert p.suspended and p.actions == ()
    assert p.held_back == (
        "FailRooms on p-0: remediation suspended by the circuit breaker",
        "CordonDecode d-2: remediation suspended by the circuit breaker",
    )


def test_breaker_caps_the_actions_of_one_round() -> None:
    det = detection(stuck("d-1", pod="p-0"), stuck("d-1", pod="p-1"), stuck("d-1", pod="p-2"))
    p = run(det, history=busy_hour(18), max_actions_per_hour=20)
    assert kinds(p) == [("FailRooms", "p-0"), ("FailRooms", "p-1")]
    assert p.held_back == ("FailRooms on p-2: remediation suspended by the circuit breaker",)


def test_breaker_counts_only_the_last_hour_and_real_actions() -> None:
    history = [
        *(entry("FailRooms", "p-0", 3601 + i) for i in range(30)),  # older than an hour
        *(entry("UncordonDecode", "d-0", 100 + i) for i in range(30)),  # restores service
        *(entry("RestartDecode", "d-0", 100 + i, outcome="Skipped") for i in range(30)),
        *busy_hour(30, dry_run=True),  # DryRun decisions count only in DryRun
    ]
    assert actions_in_last_hour(history, NOW, dry_run=False, reset_at=None) == 0
    assert actions_in_last_hour(history, NOW, dry_run=True, reset_at=None) == 30
    assert kinds(run(detection(stuck()), history=history, max_actions_per_hour=1)) == [
        ("FailRooms", "p-0")
    ]


def test_breaker_reset_forgets_earlier_actions() -> None:
    history = busy_hour(20)  # 60..79 s ago
    p = run(detection(stuck()), history=history, reset_at=ago(30), max_actions_per_hour=20)
    assert not p.suspended and kinds(p) == [("FailRooms", "p-0")]
    assert actions_in_last_hour(history, NOW, False, reset_at=ago(70)) == 10
    # A reset older than the hour changes nothing.
    assert actions_in_last_hour(history, NOW, False, reset_at=ago(7200)) == 20


def test_uncordon_still_happens_while_suspended() -> None:
    history = [*busy_hour(20), entry("CordonDecode", "d-1", 300)]
    p = run(HEALTHY_D1, pods(cordoned={"d-1": 300}), history, max_actions_per_hour=20)
    assert p.suspended and kinds(p) == [("UncordonDecode", "d-1")]


# -- DryRun and Off ------------------------------------------------------------------------


def test_dry_run_decides_and_marks_the_plan() -> None:
    p = run(detection(stuck("d-1"), stalled_decodes=["d-2"]), mode="DryRun")
    assert p.dry_run
    assert kinds(p) == [("FailRooms", "p-0"), ("CordonDecode", "d-2")]


def test_dry_run_uses_a_virtual_cordon_from_the_ledger() -> None:
    # The pod is not cordoned for real; the recorded decision stands in for the cordon.
    history = [entry("CordonDecode", "d-2", 61, dry_run=True)]
    p = run(stalled("d-2"), pods(4), history, mode="DryRun")
    assert p.dry_run and kinds(p) == [("RestartDecode", "d-2")]
    # A real (Enforce) ledger entry is not a virtual cordon.
    history = [entry("CordonDecode", "d-2", 61)]
    p = run(stalled("d-2"), pods(4), history, mode="DryRun", cooldown_seconds=0)
    assert kinds(p) == [("CordonDecode", "d-2")]


def test_dry_run_never_uncordons() -> None:
    history = [entry("CordonDecode", "d-2", 300, dry_run=True)]
    assert run(Detection(), pods(4, cordoned={"d-2": 300}), history, mode="DryRun").actions == ()


def test_dry_run_reports_cordon_and_restart_once_per_wedge() -> None:
    """DryRun restarts nothing, so the stalled pod is still stalled after the decided restart:
    the virtual cordon holds through it and nothing is decided again (it used to cordon and
    restart the same pod on paper every restartAfterSeconds)."""
    history = [entry("CordonDecode", "d-2", 61, dry_run=True)]
    assert kinds(run(stalled("d-2"), pods(4), history, mode="DryRun")) == [("RestartDecode", "d-2")]
    history.append(entry("RestartDecode", "d-2", 1, dry_run=True))
    for later in (0, 60, 600):  # however long the same wedge lasts
        at = [e.model_copy(update={"time": e.time - timedelta(seconds=later)}) for e in history]
        p = run(stalled("d-2"), pods(4), at, mode="DryRun", cooldown_seconds=0)
        assert p.actions == () and p.held_back == (), later


def test_dry_run_ends_the_virtual_cordon_once_the_pod_is_healthy() -> None:
    """The wedge cleared: a DryRun uncordon is recorded once, and a new stall is a new report."""
    history = [entry("CordonDecode", "d-2", 300, dry_run=True),
               entry("RestartDecode", "d-2", 200, dry_run=True)]  # fmt: skip
    healthy = Detection(healthy_decodes=frozenset({"d-2"}))
    p = run(healthy, pods(4), history, mode="DryRun")
    assert p.dry_run and kinds(p) == [("UncordonDecode", "d-2")]
    history.append(entry("UncordonDecode", "d-2", 100, dry_run=True))
    assert run(healthy, pods(4), history, mode="DryRun").actions == ()
    p = run(stalled("d-2"), pods(4), history, mode="DryRun", cooldown_seconds=0)
    assert kinds(p) == [("CordonDecode", "d-2")]


def test_dry_run_does_not_repeat_fail_rooms_for_the_same_wedge() -> None:
    """DryRun fails nothing, so the wedge is still there next cycle: report it once, and do
    not count it as a repeat offence that would cordon its decode peer."""
    history = [entry("FailRooms", "p-0", 5, peer="d-1", dry_run=True)]
    p = run(detection(stuck("d-1"), stuck("d-3")), history=history, mode="DryRun")
    assert kinds(p) == [("FailRooms", "p-0")] and p.actions[0].peer == "d-3"
    history = [entry("FailRooms", "p-0", 61, peer="d-1", dry_run=True)]
    assert kinds(run(detection(stuck("d-1")), history=history, mode="DryRun")) == [
        ("FailRooms", "p-0")
    ]


def test_off_does_nothing() -> None:
    history = [entry("CordonDecode", "d-1", 300)]
    p = run(
        detection(stuck("d-1"), stalled_decodes=["d-1", "d-2"]), pods(4, cordoned={"d-1": 300}),
        history, mode="Off",
    )  # fmt: skip
    assert p == Plan(budget=2)


# -- actions not allowed, stale and terminating pods ---------------------------------------


def test_actions_not_in_the_spec_are_held_back_with_a_reason() -> None:
    p = run(detection(stuck("d-1"), stalled_decodes=["d-2"]), actions=["FailRooms"])
    assert kinds(p) == [("FailRooms", "p-0")]
    assert p.held_back == ("CordonDecode d-2: not in spec.remediation.actions",)
    p = run(detection(stuck("d-1"), stalled_decodes=["d-2"]), actions=["CordonDecode"])
    assert kinds(p) == [("CordonDecode", "d-2")]
    assert p.held_back == ("FailRooms on p-0: not in spec.remediation.actions",)
    history = [entry("CordonDecode", "d-2", 61)]
    p = run(stalled("d-2"), pods(cordoned={"d-2": 61}), history, actions=["CordonDecode"])
    assert p.actions == ()
    assert p.held_back == ("RestartDecode d-2: not in spec.remediation.actions",)


def test_stale_and_terminating_decodes_are_never_acted_on() -> None:
    decodes = pods(4, stale={"d-1"}, terminating={"d-2"})
    assert run(stalled("d-1", "d-2"), decodes).actions == ()
    history = [entry("CordonDecode", "d-1", 300)]
    decodes = pods(4, cordoned={"d-1": 300}, stale={"d-1"})
    assert run(Detection(), decodes, history).actions == ()  # not uncordoned blind either
