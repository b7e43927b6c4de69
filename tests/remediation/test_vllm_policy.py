"""remediation.plan on stock vLLM: a decode's KV read stuck on a frozen prefill -> RestartPrefill.

vLLM 0.32 has no deadline on a decode's NIXL read and, under the flags pdwarden renders, no abort;
deleting the prefill ends the read (the decode recomputes, kv_load_failure_policy recompute).
The finding (detect/pull.py) names the prefill as `peer` only when it is the one prefill not
proven alive; only that pod is restarted, once per restartAfterSeconds, never when stale or when
another prefill is not ready. Each case fixes `now` and the ledger, so every age is exact.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from pdwarden.api import LedgerEntry, RemediationSpec
from pdwarden.remediation.decide import Plan, PlannedAction, PodState, plan
from pdwarden.remediation.detect.evidence import Finding
from pdwarden.remediation.detect.rules import Detection

NOW = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
ALL = ["FailRooms", "CordonDecode", "RestartDecode", "AbortRequests", "RestartPrefill"]


def stuck(peer: str | None = "p-0", suspects: tuple[str, ...] = ("p-0",)) -> Finding:
    return Finding(
        pod="d-0", role="decode", reason="KVReadStuck", room_count=1, oldest_seconds=50.0,
        peer=peer, suspects=suspects, evidence="1 KV reads in flight for 50s",
    )  # fmt: skip


def prefill(
    name: str, ready: bool = True, terminating: bool = False, stale: bool = False
) -> PodState:
    return PodState(name, f"uid-{name}", ready=ready, terminating=terminating, stale=stale)


def run(
    *findings: Finding,
    history: list[LedgerEntry] | None = None,
    prefills: list[PodState] | None = None,
    engine: str = "vllm",
    **kw: Any,
) -> Plan:
    kw.setdefault("actions", ALL)
    kw.setdefault("restart_after_seconds", 120)
    kw.setdefault("wedge_after_seconds", 45)
    kw.setdefault("cooldown_seconds", 30)
    decodes = [PodState("d-0", "uid-d-0", ready=True), PodState("d-1", "uid-d-1", ready=True)]
    return plan(
        RemediationSpec(**kw), Detection(tuple(findings)), decodes, history or [], NOW,
        decode_replicas=2, engine=engine,
        prefills=[prefill("p-0"), prefill("p-1")] if prefills is None else prefills,
    )  # fmt: skip


def test_the_prefill_a_stuck_read_waits_on_is_restarted() -> None:
    p = run(stuck())
    assert p.actions == (
        PlannedAction("RestartPrefill", "p-0", "KVReadStuck on d-0: 1 KV reads in flight for 50s",
               uid="uid-p-0", peer="d-0"),
    )  # fmt: skip


def test_no_restart_when_the_read_names_no_single_prefill() -> None:
    assert run(stuck(peer=None, suspects=("p-0", "p-1"))).actions == ()
    assert run(stuck(peer=None, suspects=())).actions == ()


def test_restart_prefill_is_opt_in() -> None:
    p = run(stuck(), actions=["CordonDecode", "RestartDecode"])
    assert p.actions == ()
    assert p.held_back == ("RestartPrefill on p-0: not in spec.remediation.actions",)


def test_one_restart_per_prefill_even_with_several_stuck_decodes() -> None:
    other = Finding(pod="d-1", role="decode", reason="KVReadStuck", peer="p-0", suspects=("p-0",))
    assert [a.pod for a in run(stuck(), other).actions] == ["p-0"]


def test_after_a_restart_nothing_until_restart_after_seconds() -> None:
    done = LedgerEntry(time=NOW - timedelta(seconds=100), action="RestartPrefill", pod="p-0")
    assert run(stuck(), history=[done]).actions == ()
    older = LedgerEntry(time=NOW - timedelta(seconds=130), action="RestartPrefill", pod="p-0")
    assert [a.kind for a in run(stuck(), history=[older]).actions] == ["RestartPrefill"]


def test_a_prefill_already_restarting_or_with_stale_metrics_is_left_alone() -> None:
    assert run(stuck(), prefills=[prefill("p-0", ready=False)]).actions == ()
    assert run(stuck(), prefills=[prefill("p-0", terminating=True)]).actions == ()
    p = run(stuck(), prefills=[prefill("p-0", stale=True)])
    assert p.actions == () and p.held_back == ("RestartPrefill on p-0: its metrics are stale",)


def test_held_while_another_prefill_is_not_ready() -> None:
    p = run(stuck(), prefills=[prefill("p-0"), prefill("p-1", ready=False)])
    assert p.actions == ()
    assert p.held_back == ("RestartPrefill on p-0: prefill pod(s) p-1 not ready yet",)


def test_dry_run_records_the_decision_once_per_restart_window() -> None:
    p = run(stuck(), mode="DryRun")
    assert p.dry_run and [a.kind for a in p.actions] == ["RestartPrefill"]
    decided = LedgerEntry(
        time=NOW - timedelta(seconds=10), action="RestartPrefill", pod="p-0", dry_run=True
    )
    assert run(stuck(), mode="DryRun", history=[decided]).actions == ()


def test_other_engines_do_not_act_on_kv_read_stuck() -> None:
    assert run(stuck(), engine="pdworker").actions == ()
    assert run(stuck(), engine="sglang").actions == ()
