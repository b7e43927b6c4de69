"""ledger: entries, the breaker's reset, the status a cycle writes, and merging two writers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from pdwarden.api import (
    Condition,
    LedgerEntry,
    PDDeploymentStatus,
    RemediationSpec,
    RemediationStatus,
)
from pdwarden.constants import ANNOTATION_RESET_BREAKER
from pdwarden.remediation.decide import Plan, PlannedAction, PodState
from pdwarden.remediation.detect.evidence import Finding
from pdwarden.remediation.detect.rules import Detection
from pdwarden.remediation.record.ledger import (
    TALLY_EVERY_SECONDS,
    breaker_reset_at,
    cycle_status,
    held_tally,
    ledger_entry,
    merge_history,
    rebase,
)
from pdwarden.values import CanaryCost

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def entry(seconds_ago: float, pod: str = "p-0", **kw: Any) -> LedgerEntry:
    return LedgerEntry(time=NOW - timedelta(seconds=seconds_ago), action="FailRooms", pod=pod, **kw)


def suspended(status: str, generation: int) -> Condition:
    return Condition(
        type="RemediationSuspended", status=status, reason="CircuitBreakerOpen",
        last_transition_time=NOW, observed_generation=generation,
    )  # fmt: skip


def test_the_breaker_resets_on_the_annotation_or_a_spec_change_since_it_tripped() -> None:
    tripped = PDDeploymentStatus(conditions=[suspended("True", 3)])
    assert breaker_reset_at({ANNOTATION_RESET_BREAKER: "now"}, 3, tripped, NOW) == NOW
    assert breaker_reset_at({}, 4, tripped, NOW) == NOW
    assert breaker_reset_at({}, 3, tripped, NOW) is None
    earlier = NOW - timedelta(minutes=5)
    kept = PDDeploymentStatus(remediation=RemediationStatus(breaker_reset_at=earlier))
    assert breaker_reset_at({}, 3, kept, NOW) == earlier


def test_an_entry_from_hostile_words_is_still_a_valid_entry() -> None:
    action = PlannedAction("FailRooms", "p-0", "x\x00" * 5000, peer="P" * 254, room_count=-3)
    e = ledger_entry(action, now=NOW, dry_run=False, outcome="Failed", detail="y" * 9999)
    assert e.peer is None and e.rooms == 0 and len(e.reason) <= 1024 and e.reason.isprintable()


def _status(history: list[LedgerEntry], *, limit: int, previous: PDDeploymentStatus | None = None,
            detection: Detection | None = None) -> PDDeploymentStatus:  # fmt: skip
    return cycle_status(
        previous=previous or PDDeploymentStatus(),
        policy=RemediationSpec(max_actions_per_hour=limit, max_unavailable_decode=1),
        generation=2, detection=detection or Detection(), decision=Plan(budget=1),
        history=history, decodes=[PodState("d-0", "u", ready=True, cordoned_since=NOW)],
        now=NOW, reset_at=None,
    )  # fmt: skip


def test_the_status_counts_this_cycles_actions_in_the_breaker() -> None:
    st = _status([entry(10), entry(5)], limit=2)
    rem = st.remediation
    assert rem is not None and rem.actions_last_hour == 2 and rem.suspended
    cond = next(c for c in st.conditions if c.type == "RemediationSuspended")
    assert cond.status == "True" and ANNOTATION_RESET_BREAKER in cond.message
    assert [c.pod for c in rem.cordoned] == ["d-0"]
    open_ = _status([entry(10)], limit=2)
    assert open_.remediation is not None and not open_.remediation.suspended


def test_an_open_breaker_keeps_the_generation_it_tripped_at() -> None:
    previous = PDDeploymentStatus(conditions=[suspended("True", 1)])
    st = _status([entry(10), entry(5)], limit=2, previous=previous)
    cond = next(c for c in st.conditions if c.type == "RemediationSuspended")
    assert cond.observed_generation == 1


def test_wedges_are_recorded_bounded_and_valid() -> None:
    f = Finding(pod="p-0", role="prefill", reason="InflightStuck", room_count=3,
                oldest_seconds=float("inf"), peer="not a pod!", evidence="e")  # fmt: skip
    st = _status([], limit=5, detection=Detection(findings=(f,) * 40))
    assert len(st.wedges) == 32 and st.wedges[0].peer is None
    assert st.wedged_rooms == 120 and st.phase == "Wedged"


def test_merged_ledgers_lose_nothing_and_keep_one_copy() -> None:
    a, b, c = entry(30), entry(20, pod="p-1"), entry(10)
    assert merge_history([a, c], [b, c]) == [a, b, c]
    many = [entry(i) for i in range(80)]
    assert merge_history(many) == sorted(many, key=lambda e: e.time)[-50:]


def test_rebase_keeps_both_writers_entries_and_each_writers_own_fields() -> None:
    base = PDDeploymentStatus(
        observed_generation=1, remediation=RemediationStatus(history=[entry(60)])
    )
    # They (another replica) recorded an action and saw generation 2.
    theirs = base.model_copy(update={
        "observed_generation": 2,
        "remediation": RemediationStatus(history=[entry(60), entry(30, pod="p-1")]),
    })  # fmt: skip
    # We recorded an action and changed the Wedged condition, from the old base.
    wedged = Condition(type="Wedged", status="True", reason="WedgesFound", last_transition_time=NOW)
    ours = base.model_copy(update={
        "conditions": [wedged],
        "remediation": RemediationStatus(history=[entry(60), entry(5, pod="p-2")]),
    })  # fmt: skip
    merged = rebase(ours, base, theirs)
    assert merged.remediation is not None
    assert [e.pod for e in merged.remediation.history] == ["p-0", "p-1", "p-2"]
    assert merged.observed_generation == 2  # theirs: we did not change it
    assert [c.type for c in merged.conditions] == ["Wedged"]  # ours
    assert merged.phase == "Wedged"


def test_what_canaries_cost_is_summed_from_the_previous_status() -> None:
    quiet = _status([], limit=5)
    assert quiet.remediation is not None and quiet.remediation.canaries is None  # none sent yet
    first = _status([], limit=5, detection=Detection(canary_cost=CanaryCost(2, 3, 4.25)))
    tally = first.remediation.canaries if first.remediation else None
    assert tally is not None and (tally.sent, tally.requests, tally.seconds) == (2, 3, 4.25)
    assert tally.since == tally.last == NOW
    later = _status([], limit=5, previous=first,
                    detection=Detection(canary_cost=CanaryCost(1, 2, 0.5)))  # fmt: skip
    again = later.remediation.canaries if later.remediation else None
    assert again is not None and (again.sent, again.requests, again.seconds) == (3, 5, 4.75)
    idle = _status([], limit=5, previous=later)  # a cycle without canaries keeps the sum
    assert idle.remediation is not None and idle.remediation.canaries == again


def test_a_tally_that_is_all_that_changed_is_held_until_it_is_due() -> None:
    first = _status([], limit=5, detection=Detection(canary_cost=CanaryCost(1, 2, 0.5)))
    more = _status([], limit=5, previous=first,
                   detection=Detection(canary_cost=CanaryCost(1, 2, 0.5)))  # fmt: skip
    held, carried = held_tally(more, first, NOW + timedelta(seconds=TALLY_EVERY_SECONDS - 1))
    assert not carried and held == first  # no status write for the tally alone
    due, carried = held_tally(more, first, NOW + timedelta(seconds=TALLY_EVERY_SECONDS))
    assert carried and due == more
    other = more.model_copy(update={"wedged_rooms": 3})  # any other change carries it along
    assert held_tally(other, first, NOW) == (other, True)
    fresh = _status([], limit=5)  # none before: the first tally is written at once
    assert held_tally(first, fresh, NOW) == (first, True)
