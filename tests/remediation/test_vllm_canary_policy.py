"""remediation.policy.canary and plan rung 2v: a vLLM decode frozen behind its live API server.

Its own metrics look idle and /health answers 200; only a prefill's LeaseExpired names it as a
suspect. The cycle asks the suspects (and the decodes cordoned by us) for one token; a dead
verdict makes the decode stalled and not serving, so it is cordoned even as the last ready decode
or with the budget used up, then restarted restartAfterSeconds later while still dead; alive
again, it is uncordoned; alive and unknown never start anything. `now` and the ledger are fixed,
so every age is exact.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from pdwarden.api import LedgerEntry, RemediationSpec
from pdwarden.remediation.decide import Plan, PodState, plan
from pdwarden.remediation.decide.verdicts import candidates, with_verdicts
from pdwarden.remediation.detect.evidence import Finding
from pdwarden.remediation.detect.rules import Detection
from pdwarden.values import CanaryResult, CanaryVerdict

NOW = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
DEAD = "no token within 30s while its API server answers /v1/models"


def lease(*suspects: str) -> Finding:
    return Finding(
        pod="p-0", role="prefill", reason="LeaseExpired", suspects=suspects,
        peer=suspects[0] if len(suspects) == 1 else None,
        evidence="2 requests' KV freed unread after their lease",
    )  # fmt: skip


def verdict(pod: str, v: CanaryVerdict) -> CanaryResult:
    return CanaryResult(pod, v, DEAD if v == "dead" else f"{v} detail")


def decode(name: str, cordoned: float | None = None, ready: bool = True, **flags: bool) -> PodState:
    """A decode pod; `cordoned`: seconds since pdwarden cordoned it (then not Ready: the gate)."""
    since = NOW - timedelta(seconds=cordoned) if cordoned is not None else None
    return PodState(name, f"uid-{name}", ready=ready and since is None, cordoned_since=since,
                     **flags)  # fmt: skip


def confirmed(
    *findings: Finding, verdicts: tuple[CanaryResult, ...] = (), healthy: tuple[str, ...] = (),
    stalled: tuple[str, ...] = (),
) -> Detection:  # fmt: skip
    base = Detection(tuple(findings), stalled_decodes=frozenset(stalled),
                     healthy_decodes=frozenset(healthy))  # fmt: skip
    return with_verdicts(base, verdicts)


def run(
    detection: Detection, decodes: list[PodState], history: list[LedgerEntry] | None = None,
    **kw: Any,
) -> Plan:  # fmt: skip
    kw.setdefault("restart_after_seconds", 120)
    kw.setdefault("wedge_after_seconds", 45)
    kw.setdefault("cooldown_seconds", 30)
    return plan(
        RemediationSpec(**kw), detection, decodes, history or [], NOW,
        decode_replicas=len(decodes), engine="vllm",
    )  # fmt: skip


# -- who is asked ---------------------------------------------------------------------------


def test_suspects_and_cordoned_decodes_are_asked_once_each_and_only_on_vllm() -> None:
    decodes = [decode("d-0"), decode("d-1", cordoned=10), decode("d-2"), decode("d-3")]
    stuck = Finding(pod="d-3", role="decode", reason="KVReadStuck", suspects=("p-0",))
    det = Detection((lease("d-0", "d-1"), lease("d-0"), stuck))
    assert candidates("vllm", det, decodes, [], dry_run=False) == ("d-0", "d-1")
    assert candidates("sglang", det, decodes, [], dry_run=False) == ()
    assert candidates("pdworker", det, decodes, [], dry_run=False) == ()
    assert candidates("vllm", Detection(), [decode("d-0")], [], dry_run=False) == ()


def test_stale_and_terminating_decodes_are_never_asked() -> None:
    decodes = [
        decode("d-0", stale=True),
        decode("d-1", cordoned=5, terminating=True),
        decode("d-2"),
    ]
    det = Detection((lease("d-0", "d-1", "d-2"),))
    assert candidates("vllm", det, decodes, [], dry_run=False) == ("d-2",)


def test_in_dry_run_the_recorded_cordon_decision_makes_a_decode_a_candidate() -> None:
    decided = LedgerEntry(time=NOW - timedelta(seconds=20), action="CordonDecode", pod="d-1",
                          dry_run=True)  # fmt: skip
    decodes = [decode("d-0"), decode("d-1")]
    assert candidates("vllm", Detection(), decodes, [decided], dry_run=True) == ("d-1",)
    assert candidates("vllm", Detection(), decodes, [decided], dry_run=False) == ()


# -- what a verdict means ---------------------------------------------------------------------


def test_a_dead_verdict_makes_the_decode_stalled_and_never_healthy_and_says_so() -> None:
    det = confirmed(lease("d-0", "d-1"), healthy=("d-0", "d-1"),
                    verdicts=(verdict("d-0", "dead"), verdict("d-1", "alive")))  # fmt: skip
    assert det.stalled_decodes == {"d-0"} and det.dead_decodes == {"d-0"}
    assert det.healthy_decodes == {"d-1"}
    (f,) = det.findings
    assert f.evidence.endswith(f"; canary: d-0 dead ({DEAD}); d-1 alive (alive detail)")


def test_alive_and_unknown_verdicts_change_nothing_the_plan_reads() -> None:
    base = Detection((lease("d-0", "d-1"),), healthy_decodes=frozenset({"d-0"}))
    det = with_verdicts(base, (verdict("d-0", "alive"), verdict("d-1", "unknown")))
    assert det.stalled_decodes == base.stalled_decodes == frozenset()
    assert det.healthy_decodes == base.healthy_decodes and det.dead_decodes == frozenset()


# -- the ladder (plan rung 2v) -----------------------------------------------------------------


def test_a_confirmed_dead_last_decode_is_cordoned() -> None:
    """Today's rule never cordons the last ready decode; a dead engine serves nobody."""
    det = confirmed(lease("d-0"), verdicts=(verdict("d-0", "dead"),))
    p = run(det, [decode("d-0")])
    (a,) = p.actions
    assert (a.kind, a.pod, a.uid) == ("CordonDecode", "d-0", "uid-d-0")
    assert a.reason == f"engine frozen, canary: {DEAD}"
    assert p.held_back == ()


def test_a_dead_decode_is_cordoned_whatever_the_budget() -> None:
    # The default 25% of 2 decodes is a budget of 0; another decode is already cordoned too.
    det = confirmed(lease("d-0"), verdicts=(verdict("d-0", "dead"),))
    p = run(det, [decode("d-0"), decode("d-1", cordoned=600)], max_unavailable_decode="25%")
    assert [(a.kind, a.pod) for a in p.actions] == [("CordonDecode", "d-0")]


def test_a_dead_decode_counts_neither_as_serving_nor_against_the_budget_of_others() -> None:
    # d-1 stalls on its metrics. With d-0 dead, d-1 is the last one serving: it is held.
    det = confirmed(lease("d-0"), stalled=("d-1",), verdicts=(verdict("d-0", "dead"),))
    p = run(det, [decode("d-0"), decode("d-1")], max_unavailable_decode=1)
    assert [(a.kind, a.pod) for a in p.actions] == [("CordonDecode", "d-0")]
    assert p.held_back == ("CordonDecode d-1: it is the last serving decode pod",)
    # With a third decode serving, d-1 is cordoned: the dead d-0 used none of the budget of 1.
    p = run(det, [decode("d-0", cordoned=10), decode("d-1"), decode("d-2")],
            max_unavailable_decode=1)  # fmt: skip
    assert [(a.kind, a.pod) for a in p.actions] == [("CordonDecode", "d-1")]


def test_still_dead_restart_after_seconds_after_the_cordon_is_restarted() -> None:
    det = confirmed(verdicts=(verdict("d-0", "dead"),))
    assert run(det, [decode("d-0", cordoned=100)]).actions == ()  # not yet: 100 < 120
    (a,) = run(det, [decode("d-0", cordoned=130)]).actions
    assert (a.kind, a.pod, a.uid) == ("RestartDecode", "d-0", "uid-d-0")
    assert a.reason == f"cordoned 130s ago and still dead, canary: {DEAD}"


def test_alive_again_a_cordoned_decode_is_uncordoned() -> None:
    det = confirmed(healthy=("d-0",), verdicts=(verdict("d-0", "alive"),))
    (a,) = run(det, [decode("d-0", cordoned=130), decode("d-1")]).actions
    assert (a.kind, a.pod) == ("UncordonDecode", "d-0")
    assert a.reason == "healthy for a full window; canary: alive detail"


def test_dead_it_is_never_uncordoned_though_its_idle_metrics_look_healthy() -> None:
    det = confirmed(healthy=("d-0",), verdicts=(verdict("d-0", "dead"),))
    assert run(det, [decode("d-0", cordoned=60), decode("d-1")]).actions == ()


def test_an_alive_or_unknown_suspect_gets_nothing() -> None:
    for v in ("alive", "unknown"):
        det = confirmed(lease("d-0"), verdicts=(verdict("d-0", v),))  # type: ignore[arg-type]
        p = run(det, [decode("d-0"), decode("d-1")], max_unavailable_decode=1)
        assert p.actions == () and p.held_back == ()


def test_a_dead_decode_still_waits_for_cooldown_and_the_breaker() -> None:
    det = confirmed(lease("d-0"), verdicts=(verdict("d-0", "dead"),))
    uncordoned = LedgerEntry(time=NOW - timedelta(seconds=10), action="UncordonDecode", pod="d-0")
    p = run(det, [decode("d-0")], history=[uncordoned])
    assert p.actions == ()
    assert p.held_back == ("CordonDecode d-0: in cooldown after the last action",)
    earlier = LedgerEntry(time=NOW - timedelta(seconds=600), action="FailRooms", pod="x")
    p = run(det, [decode("d-0")], max_actions_per_hour=1, history=[earlier])
    assert p.actions == ()
    assert p.held_back == ("CordonDecode d-0: remediation suspended by the circuit breaker",)


def test_in_dry_run_the_dead_decode_is_reported_once_then_restarted_virtually() -> None:
    det = confirmed(lease("d-0"), verdicts=(verdict("d-0", "dead"),))
    p = run(det, [decode("d-0")], mode="DryRun")
    assert p.dry_run and [(a.kind, a.pod) for a in p.actions] == [("CordonDecode", "d-0")]
    decided = LedgerEntry(time=NOW - timedelta(seconds=130), action="CordonDecode", pod="d-0",
                          dry_run=True)  # fmt: skip
    p = run(det, [decode("d-0")], mode="DryRun", history=[decided])
    assert [(a.kind, a.pod) for a in p.actions] == [("RestartDecode", "d-0")]
