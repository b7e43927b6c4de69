"""remediation.plan on stock SGLang: the prefill-side ladder AbortRequests -> RestartPrefill.

SGLang 0.5.23 has no rooms API, so its prefill findings carry no room ids; the only repair that
frees its wedged rooms is aborting every request of that prefill pod (POST /abort_request with
abort_all), and a prefill restart when that did not drain the queue. Each case fixes `now` and
the ledger, so every age is exact; the same budget, cooldown, breaker and DryRun rules apply.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from pdwarden.api import LedgerEntry, RemediationSpec
from pdwarden.remediation.decide import Plan, PlannedAction, PodState, plan
from pdwarden.remediation.detect.evidence import Finding
from pdwarden.remediation.detect.rules import Detection

NOW = datetime(2025, 6, 1, 12, 0, 0, tzinfo=UTC)
ALL = ["FailRooms", "CordonDecode", "RestartDecode", "AbortRequests", "RestartPrefill"]


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


def wedged(pod: str = "p-0", reason: str = "InflightGaugeStuck") -> Finding:
    return Finding(
        pod=pod, role="prefill", reason=reason,  # type: ignore[arg-type]
        room_count=3, oldest_seconds=70.0, evidence="inflight queue >= 3 for 70s",
    )  # fmt: skip


def prefill(name: str = "p-0", ready: bool = True, terminating: bool = False) -> PodState:
    return PodState(name, f"uid-{name}", ready=ready, terminating=terminating)


def entry(action: str, pod: str, seconds_ago: float, **kw: Any) -> LedgerEntry:
    return LedgerEntry(time=ago(seconds_ago), action=action, pod=pod, **kw)


def run(
    *findings: Finding,
    history: list[LedgerEntry] | None = None,
    prefills: list[PodState] | None = None,
    engine: str = "sglang",
    **kw: Any,
) -> Plan:
    kw.setdefault("actions", ALL)
    kw.setdefault("restart_after_seconds", 60)
    kw.setdefault("wedge_after_seconds", 60)
    kw.setdefault("cooldown_seconds", 30)
    decodes = [PodState(f"d-{i}", f"uid-d-{i}", ready=True) for i in range(2)]
    return plan(
        RemediationSpec(**kw), Detection(tuple(findings)), decodes, history or [], NOW,
        decode_replicas=2, engine=engine,
        prefills=[prefill("p-0"), prefill("p-1")] if prefills is None else prefills,
    )  # fmt: skip


def kinds(p: Plan) -> list[tuple[str, str]]:
    return [(a.kind, a.pod) for a in p.actions]


@pytest.mark.parametrize("reason", ["InflightGaugeStuck", "InflightStuck"])
def test_a_wedged_sglang_prefill_gets_its_requests_aborted(reason: str) -> None:
    p = run(wedged(reason=reason))
    assert p.actions == (
        PlannedAction("AbortRequests", "p-0", f"{reason}: inflight queue >= 3 for 70s",
               uid="uid-p-0", room_count=3),
    )  # fmt: skip


def test_abort_is_in_the_default_actions_and_restart_prefill_is_not() -> None:
    spec = RemediationSpec()
    assert "AbortRequests" in spec.actions and "RestartPrefill" not in spec.actions


def test_one_abort_per_pod_even_with_several_findings() -> None:
    p = run(wedged("p-0"), wedged("p-0", "InflightStuck"), wedged("p-1"))
    assert kinds(p) == [("AbortRequests", "p-0"), ("AbortRequests", "p-1")]


def test_pdworker_findings_without_rooms_are_not_aborted() -> None:
    # pdworker fails rooms by id; a gauge-only finding there has nothing to act on.
    assert run(wedged(), engine="pdworker").actions == ()


def test_no_second_abort_while_the_first_takes_effect() -> None:
    assert run(wedged(), history=[entry("AbortRequests", "p-0", 45)]).actions == ()


def test_still_wedged_after_restart_after_seconds_restarts_the_prefill() -> None:
    p = run(wedged(), history=[entry("AbortRequests", "p-0", 61, rooms=3)])
    assert kinds(p) == [("RestartPrefill", "p-0")]
    assert p.actions[0].uid == "uid-p-0"
    assert "still wedged 61s after aborting its requests" in p.actions[0].reason


def test_restart_prefill_is_opt_in() -> None:
    actions = ["FailRooms", "CordonDecode", "RestartDecode", "AbortRequests"]
    p = run(wedged(), history=[entry("AbortRequests", "p-0", 61)], actions=actions)
    assert p.actions == ()
    assert p.held_back == ("RestartPrefill on p-0: not in spec.remediation.actions",)


def test_abort_not_allowed_is_held_back_with_the_reason() -> None:
    p = run(wedged(), actions=["FailRooms", "CordonDecode", "RestartDecode"])
    assert p.actions == ()
    assert p.held_back == ("AbortRequests on p-0: not in spec.remediation.actions",)


def test_only_one_prefill_pod_restarts_at_a_time() -> None:
    p = run(
        wedged(),
        history=[entry("AbortRequests", "p-0", 61)],
        prefills=[prefill("p-0"), prefill("p-1", ready=False)],
    )
    assert p.actions == ()
    assert p.held_back == ("RestartPrefill on p-0: prefill pod(s) p-1 not ready yet",)


def test_a_wedge_long_after_the_last_abort_starts_the_ladder_again() -> None:
    p = run(wedged(), history=[entry("AbortRequests", "p-0", 60 + 60 + 1)])
    assert kinds(p) == [("AbortRequests", "p-0")]
    assert "new wedge" in p.actions[0].reason


def test_after_a_restart_wait_for_the_new_pod_then_abort_first_again() -> None:
    assert run(wedged(), history=[entry("RestartPrefill", "p-0", 40)]).actions == ()
    p = run(wedged(), history=[entry("RestartPrefill", "p-0", 61)])
    assert kinds(p) == [("AbortRequests", "p-0")]


def test_cooldown_applies_to_prefill_pods() -> None:
    p = run(wedged(), history=[entry("AbortRequests", "p-0", 61)], cooldown_seconds=120)
    assert p.actions == ()


def test_a_failed_abort_is_retried() -> None:
    p = run(wedged(), history=[entry("AbortRequests", "p-0", 10, outcome="Failed")])
    assert kinds(p) == [("AbortRequests", "p-0")]


def test_circuit_breaker_holds_the_abort() -> None:
    history = [entry("CordonDecode", f"d-{i % 2}", 100 + i) for i in range(3)]
    p = run(wedged(), history=history, max_actions_per_hour=3)
    assert p.actions == () and p.suspended
    assert p.held_back == ("AbortRequests on p-0: remediation suspended by the circuit breaker",)


def test_dry_run_records_the_ladder_without_repeating_it_every_cycle() -> None:
    first = run(wedged(), mode="DryRun")
    assert first.dry_run and kinds(first) == [("AbortRequests", "p-0")]
    decided = entry("AbortRequests", "p-0", 20, dry_run=True)
    assert run(wedged(), history=[decided], mode="DryRun").actions == ()
    # DryRun aborted nothing, so the wedge is still there a window later: it would restart.
    later = entry("AbortRequests", "p-0", 61, dry_run=True)
    assert kinds(run(wedged(), history=[later], mode="DryRun")) == [("RestartPrefill", "p-0")]
    # Enforce entries do not count for DryRun and the other way round.
    assert kinds(run(wedged(), history=[later])) == [("AbortRequests", "p-0")]


def test_off_does_nothing() -> None:
    assert run(wedged(), mode="Off").actions == ()
