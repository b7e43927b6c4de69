"""Pair canaries in whole PDDeployment cycles (engine vllm): the real shell over fakes.

`ClockWorkers` serves vLLM pods whose samples are 2 s apart (a scrape clock, so a 10 s quiet
window passes in six cycles, not ten seconds): `frozen` pods' counters stand still, the others'
move. `PairFake` says what a canary through each pair finds. Each test asserts what a user sees:
the ledger, the pod's serving condition, the counters pdwarden exports.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from prometheus_client import REGISTRY
from shell_fakes import CanaryFake, KubeFake, WorkerFake, cluster

from pdwarden import engines
from pdwarden.constants import KIND, LABEL_ROLE
from pdwarden.handlers.on_deployment import OperatorState, remediation_cycle
from pdwarden.remediation.record import ledger
from pdwarden.values import PairCanary, PairOutcome, PairResult, Sample, Target

KEY = b"k" * 32
STEP = 2.0  # seconds between two samples of the scrape clock


@dataclass
class ClockWorkers(WorkerFake):
    frozen: set[str] = field(default_factory=set)
    pending: set[str] = field(default_factory=set)  # pods with a request running
    _n: Counter[str] = field(default_factory=Counter)
    t0: float = field(default_factory=time.monotonic)

    def _sample(self, target: Target) -> Sample:
        self._n[target.pod] += 1
        n = self._n[target.pod]
        moving = 0.0 if target.pod in self.frozen else 7.0 * n
        return Sample(
            at=self.t0 + STEP * n, running=float(target.pod in self.pending), waiting_queue=0.0,
            reading_queue=0.0,
            prefill_tokens=100.0 + moving, generated_tokens=50.0 + moving, completed=3.0,
        )  # fmt: skip


@dataclass
class PairFake:
    """ports.PairCanaryApi: the next of `script` while it lasts, then `outcomes[(prefill,
    decode)]` (decoded when unset); `asked` pairs."""

    outcomes: dict[tuple[str, str], PairOutcome] = field(default_factory=dict)
    script: list[PairOutcome] = field(default_factory=list)
    asked: list[tuple[str, str]] = field(default_factory=list)
    deadlines: list[float] = field(default_factory=list)
    kv_sent: bool = False  # the "health" protocol's KV request goes out beside the checks

    async def pair(
        self, prefill: Target, decode: Target, canary: PairCanary, tenant: str = "",
        deadline: float = 8.0,
    ) -> PairResult:  # fmt: skip
        self.asked.append((prefill.pod, decode.pod))
        self.deadlines.append(deadline)
        outcome = (
            self.script.pop(0) if self.script
            else self.outcomes.get((prefill.pod, decode.pod), "decoded")
        )  # fmt: skip
        return PairResult(prefill.pod, decode.pod, outcome, f"{outcome} (fake)", 0.1,
                          prefill_answered=outcome != "prefill_dead",
                          decode_answered=outcome in ("decoded", "alive"), prefill_sent=True,
                          decode_sent=outcome != "prefill_dead",
                          kv_sent=self.kv_sent)  # fmt: skip


def setup(
    kube: KubeFake, workers: ClockWorkers, pair: PairFake, **remediation: Any
) -> OperatorState:
    cluster(kube, prefill=1, decode=2, **remediation)
    kube.objects[(KIND, "ns", "pd")]["spec"]["engine"] = "vllm"
    return OperatorState(client=kube, workers=workers, admin=workers, token_key=KEY, pair=pair)


def cycles(state: OperatorState, kube: KubeFake, n: int) -> None:
    for _ in range(n):
        asyncio.run(remediation_cycle(state, kube.obj(KIND, "ns", "pd")))


def history(kube: KubeFake) -> list[dict[str, Any]]:
    status = kube.obj(KIND, "ns", "pd").get("status") or {}
    return list((status.get("remediation") or {}).get("history") or [])


def sent(outcome: str) -> float:
    return REGISTRY.get_sample_value("pdwarden_pair_canaries_total", {"outcome": outcome}) or 0.0


def remediated() -> float:
    return REGISTRY.get_sample_value("pdwarden_time_to_remediate_seconds_count") or 0.0


def asked(state: OperatorState, kube: KubeFake, pair: PairFake, n: int) -> None:
    """Cycles until the n-th pair canary was sent. The operator spaces canaries through a pod by
    quietSeconds of its own monotonic clock (2 s here), so cycles are paced, not counted; the
    wait ends on the canaries sent, within 10 s."""
    deadline = time.monotonic() + 10
    while len(pair.asked) < n:
        assert time.monotonic() < deadline, pair.asked
        cycles(state, kube, 1)
        time.sleep(0.2)  # pacing between cycles while the operator's quiet window runs out


@pytest.fixture
def kube() -> KubeFake:
    return KubeFake()


def test_a_decode_frozen_behind_its_api_server_is_cordoned_once_a_pair_canary_finds_it_dead(
    kube: KubeFake,
) -> None:
    workers = ClockWorkers(frozen={"pd-decode-1"})
    pair = PairFake(outcomes={("pd-prefill-0", "pd-decode-1"): "decode_dead"})
    state = setup(kube, workers, pair, canary={"failureThreshold": 1})  # the default 2: below
    before, repaired = sent("decode_dead"), remediated()
    cycles(state, kube, 1)  # one scrape: nothing to compare yet
    assert pair.asked == [] and history(kube) == []
    cycles(state, kube, 1)  # still since its last scrape: asked
    assert pair.asked == [("pd-prefill-0", "pd-decode-1")]  # paired with the live prefill
    [entry] = history(kube)
    assert (entry["action"], entry["pod"]) == ("CordonDecode", "pd-decode-1")
    assert "pair canary" in entry["reason"]
    assert sent("decode_dead") == before + 1
    assert remediated() == repaired + 1  # observed when the repair landed, not at detection
    tally = kube.obj(KIND, "ns", "pd")["status"]["remediation"]["canaries"]
    assert (tally["sent"], tally["requests"]) == (1, 2)  # one canary, both legs sent


def tally_of(kube: KubeFake) -> tuple[int, int]:
    tally = kube.obj(KIND, "ns", "pd")["status"]["remediation"]["canaries"]
    assert tally["seconds"] >= 0 and tally["since"] <= tally["last"]
    return tally["sent"], tally["requests"]


def test_what_canaries_cost_is_summed_in_the_ledger_without_a_status_write_each(
    kube: KubeFake, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Idle pods: one decoded canary per pod per quiet window. The status carries the first at
    once; later ones alone rewrite it at most every TALLY_EVERY_SECONDS (an idle fleet would
    otherwise write every object's status every quiet window), and are summed then, from what
    it said before."""
    workers = ClockWorkers(frozen={"pd-prefill-0", "pd-decode-0", "pd-decode-1"})
    pair = PairFake()
    state = setup(kube, workers, pair, canary={"quietSeconds": 2})
    requests = REGISTRY.get_sample_value("pdwarden_canary_requests_total", {"kind": "pair"})
    asked(state, kube, pair, 1)
    assert tally_of(kube) == (1, 2)
    asked(state, kube, pair, 3)
    assert tally_of(kube) == (1, 2)  # held: nothing else changed
    after = REGISTRY.get_sample_value("pdwarden_canary_requests_total", {"kind": "pair"})
    assert after == (requests or 0) + 6  # the metrics count every one at once
    monkeypatch.setattr(ledger, "TALLY_EVERY_SECONDS", 0)  # the interval has passed
    asked(state, kube, pair, 4)
    assert tally_of(kube) == (4, 8)


def test_a_cordoned_decode_dead_by_pair_canaries_stays_dead_and_is_restarted_without_waits(
    kube: KubeFake,
) -> None:
    """Between two pair canaries a decode they found dead stays dead while its counters stand
    still: never put back, restarted restartAfterSeconds after the cordon, and never asked for
    the one-token canary (which holds a cycle for 30 s on a dead decode to learn nothing new)."""
    workers = ClockWorkers(frozen={"pd-decode-1"})
    pair = PairFake(outcomes={("pd-prefill-0", "pd-decode-1"): "decode_dead"})
    canary = CanaryFake(verdicts={"pd-decode-1": "dead"})
    cluster(kube, prefill=1, decode=2, canary={"failureThreshold": 1})
    kube.objects[(KIND, "ns", "pd")]["spec"]["engine"] = "vllm"
    state = OperatorState(client=kube, workers=workers, admin=workers, token_key=KEY,
                          pair=pair, canary=canary)  # fmt: skip
    cycles(state, kube, 2)
    assert [e["action"] for e in history(kube)] == ["CordonDecode"]
    cycles(state, kube, 3)  # inside the quiet window: not asked, still dead, still cordoned
    assert pair.asked == [("pd-prefill-0", "pd-decode-1")] and canary.asked == []
    assert [e["action"] for e in history(kube)] == ["CordonDecode"]
    [wedge] = kube.obj(KIND, "ns", "pd")["status"]["wedges"]  # one finding, held all along
    assert (wedge["pod"], wedge["reason"]) == ("pd-decode-1", "DecodeDead")
    assert [e["reason"] for e in kube.events].count("WedgeDetected") == 1
    # restartAfterSeconds (60) have passed since the cordon
    kube.objects[("Pod", "ns", "pd-decode-1")]["status"]["conditions"][-1][
        "lastTransitionTime"] = "2020-01-01T00:00:00Z"  # fmt: skip
    cycles(state, kube, 1)
    assert [e["action"] for e in history(kube)] == ["CordonDecode", "RestartDecode"]
    assert "still dead, canary: pair canary: no answer to the last 1" in history(kube)[-1]["reason"]
    assert canary.asked == []  # the pair canaries' verdict stood for it in every cycle


def test_a_cordoned_decode_that_answers_a_pair_canary_is_no_longer_held_dead(
    kube: KubeFake,
) -> None:
    """One answer ends it: the decode is put back (this fake's idle decode is healthy)."""
    workers = ClockWorkers(frozen={"pd-decode-1"})
    pair = PairFake(script=["decode_dead"])  # then every canary decodes
    canary = CanaryFake()
    cluster(kube, prefill=1, decode=2, canary={"failureThreshold": 1, "quietSeconds": 2})
    kube.objects[(KIND, "ns", "pd")]["spec"]["engine"] = "vllm"
    kube.objects[("Pod", "ns", "pd-decode-0")]["metadata"]["labels"][LABEL_ROLE] = "x"  # one pair
    state = OperatorState(client=kube, workers=workers, admin=workers, token_key=KEY,
                          pair=pair, canary=canary)  # fmt: skip
    asked(state, kube, pair, 1)
    assert [e["action"] for e in history(kube)] == ["CordonDecode"]
    asked(state, kube, pair, 2)  # it answered: no longer dead, and healthy for a full window
    assert [e["action"] for e in history(kube)] == ["CordonDecode", "UncordonDecode"]
    assert "pair canary: decoded" in history(kube)[-1]["reason"]
    assert canary.asked == []


def test_a_prefill_a_pair_canary_finds_dead_is_restarted(kube: KubeFake) -> None:
    workers = ClockWorkers(frozen={"pd-prefill-0"})
    pair = PairFake(outcomes={("pd-prefill-0", "pd-decode-0"): "prefill_dead"})
    actions = ["FailRooms", "CordonDecode", "RestartDecode", "RestartPrefill"]
    state = setup(kube, workers, pair, actions=actions, canary={"failureThreshold": 1})
    cycles(state, kube, 6)
    assert pair.asked == [("pd-prefill-0", "pd-decode-0")]
    [entry] = history(kube)
    assert (entry["action"], entry["pod"]) == ("RestartPrefill", "pd-prefill-0")
    assert entry["reason"].startswith("PrefillDead: pair canary with pd-decode-0")
    assert (
        "Pod",
        "ns",
        "pd-prefill-0",
    ) not in kube.objects  # deleted: its StatefulSet makes it anew


def test_a_side_is_dead_only_after_failure_threshold_canaries_in_a_row(kube: KubeFake) -> None:
    """The default failureThreshold (2): a prefill that gave no answer is a suspect and asked
    again at once, in the same cycle, and restarted only when that canary gets nothing either;
    an answer in between starts its count again (a stalled, not dead, engine is never
    restarted)."""
    workers = ClockWorkers(frozen={"pd-prefill-0", "pd-decode-0", "pd-decode-1"})
    pair = PairFake(script=["prefill_dead", "decoded"])  # a stall, then an answer
    actions = ["FailRooms", "CordonDecode", "RestartDecode", "RestartPrefill"]
    state = setup(kube, workers, pair, actions=actions, canary={"quietSeconds": 2})
    kube.objects[("Pod", "ns", "pd-decode-1")]["metadata"]["labels"][LABEL_ROLE] = "x"  # one pair
    suspects, dead = sent("suspect"), sent("prefill_dead")

    asked(state, kube, pair, 1)  # no answer: a suspect, asked again at once; it answered
    assert len(pair.asked) == 2 and history(kube) == []
    assert sent("suspect") == suspects + 1 and sent("prefill_dead") == dead
    pair.outcomes[("pd-prefill-0", "pd-decode-0")] = "prefill_dead"
    asked(state, kube, pair, 3)  # the count started again: two misses back to back, restarted
    assert len(pair.asked) == 4 and sent("suspect") == suspects + 2
    [entry] = history(kube)
    assert (entry["action"], entry["pod"]) == ("RestartPrefill", "pd-prefill-0")
    assert "2 canaries in a row" in entry["reason"] and sent("prefill_dead") == dead + 1


def test_a_pod_that_stops_is_asked_a_scrape_later_and_then_once_per_quiet_window(
    kube: KubeFake,
) -> None:
    """A decode that served and then froze is asked at the first scrape that shows it still (a
    miss asked again at once: dead in one cycle, at the default failureThreshold 2), long before
    a 10 s quiet window ran out; still pods that answer are asked once per window only."""
    workers = ClockWorkers()
    pair = PairFake(outcomes={("pd-prefill-0", "pd-decode-1"): "decode_dead"})
    state = setup(kube, workers, pair)
    cycles(state, kube, 4)
    assert pair.asked == []  # every counter moves
    workers.frozen = {"pd-decode-1"}
    cycles(state, kube, 1)  # its last move shows now: not still yet
    assert pair.asked == []
    cycles(state, kube, 1)
    assert pair.asked == [("pd-prefill-0", "pd-decode-1")] * 2
    [entry] = history(kube)
    assert (entry["action"], entry["pod"]) == ("CordonDecode", "pd-decode-1")
    assert "2 canaries in a row" in entry["reason"]
    idle = PairFake()  # answered: once per 10 s quiet window, whatever the cycles
    kube2 = KubeFake()
    state2 = setup(kube2, ClockWorkers(frozen={"pd-prefill-0", "pd-decode-0", "pd-decode-1"}),
                   idle)  # fmt: skip
    cycles(state2, kube2, 6)
    assert idle.asked == [("pd-prefill-0", "pd-decode-0"), ("pd-prefill-0", "pd-decode-1")]


def test_a_busy_healthy_pair_gets_no_canary_and_an_idle_one_a_canary_per_quiet_window(
    kube: KubeFake,
) -> None:
    workers = ClockWorkers()
    pair = PairFake()
    state = setup(kube, workers, pair)
    cycles(state, kube, 8)
    assert pair.asked == [] and history(kube) == []  # every counter moves: nobody is quiet
    workers.frozen = {"pd-prefill-0", "pd-decode-0", "pd-decode-1"}  # all idle now
    cycles(state, kube, 8)
    # Each quiet pod once a window: the one prefill serves both decodes' canaries, one a cycle.
    assert pair.asked == [("pd-prefill-0", "pd-decode-0"), ("pd-prefill-0", "pd-decode-1")]
    assert history(kube) == []  # decoded: alive, nothing to do


def test_canaries_off_or_an_unknown_outcome_never_act(kube: KubeFake) -> None:
    workers = ClockWorkers(frozen={"pd-decode-1"})
    pair = PairFake(outcomes={("pd-prefill-0", "pd-decode-1"): "unknown"})
    state = setup(kube, workers, pair)
    cycles(state, kube, 8)
    assert pair.asked and history(kube) == []
    kube2 = KubeFake()
    off = PairFake(outcomes={("pd-prefill-0", "pd-decode-1"): "decode_dead"})
    state2 = setup(kube2, ClockWorkers(frozen={"pd-decode-1"}), off, canary={"enabled": False})
    cycles(state2, kube2, 8)
    assert off.asked == [] and history(kube2) == []


def test_the_first_canary_through_a_pair_gets_the_long_deadline_until_one_decoded(
    kube: KubeFake,
) -> None:
    """The first canary through a pair makes its KV handshake (slow on a busy machine): it gets
    firstDeadlineSeconds; once one decoded, deadlineSeconds; a restarted container is cold again."""
    workers = ClockWorkers(frozen={"pd-prefill-0", "pd-decode-0", "pd-decode-1"})
    pair = PairFake()
    state = setup(kube, workers, pair, canary={"quietSeconds": 2})
    kube.objects[("Pod", "ns", "pd-decode-1")]["metadata"]["labels"][LABEL_ROLE] = "x"  # one pair

    asked(state, kube, pair, 1)
    asked(state, kube, pair, 2)
    decode = kube.objects[("Pod", "ns", "pd-decode-0")]
    decode["status"]["containerStatuses"] = [{"name": "worker", "restartCount": 1}]
    asked(state, kube, pair, 3)
    assert pair.asked == [("pd-prefill-0", "pd-decode-0")] * 3
    assert pair.deadlines == [30.0, 4.0, 30.0]


def test_a_health_check_canary_gets_the_short_deadline_from_the_first(
    kube: KubeFake, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Health checks (SGLang's pair canary) make no KV handshake and never "decode": each gets
    deadlineSeconds, the first included (with the long one, SGLang's own 20 s verdict on a frozen
    scheduler came first, twice: ~45 s to act instead of ~20)."""
    vllm = engines.ENGINES["vllm"]
    assert vllm.pair_canary is not None
    health = replace(vllm.pair_canary, protocol="health", path="/health")
    monkeypatch.setitem(engines.ENGINES, "vllm", replace(vllm, pair_canary=health))  # type: ignore[arg-type]
    workers = ClockWorkers(frozen={"pd-prefill-0", "pd-decode-0", "pd-decode-1"})
    pair = PairFake(outcomes={("pd-prefill-0", "pd-decode-0"): "alive"})
    state = setup(kube, workers, pair, canary={"quietSeconds": 2})
    kube.objects[("Pod", "ns", "pd-decode-1")]["metadata"]["labels"][LABEL_ROLE] = "x"  # one pair

    asked(state, kube, pair, 1)
    asked(state, kube, pair, 2)
    assert pair.deadlines == [4.0, 4.0]
    assert history(kube) == []  # alive: nothing to do


# -- SGLang: transfers that keep failing while both sides answer -----------------------------


@dataclass
class FailingTransfers(ClockWorkers):
    """SGLang-shaped samples: prefills report an (empty) inflight queue and a KV transfer counter
    standing at 40; `failing` prefills fail three transfers a scrape."""

    failing: set[str] = field(default_factory=set)

    def _sample(self, target: Target) -> Sample:
        s = super()._sample(target)
        if target.role != "prefill":
            return s
        failed = 3.0 * self._n[target.pod] if target.pod in self.failing else 0.0
        return replace(s, inflight_queue=0.0, kv_transfers=40.0, failed=failed)


def sglang_setup(kube: KubeFake, workers: ClockWorkers, pair: PairFake) -> OperatorState:
    actions = ["AbortRequests", "CordonDecode", "RestartDecode", "RestartPrefill"]
    cluster(kube, prefill=1, decode=1, actions=actions, wedgeAfterSeconds=20)
    spec = kube.objects[(KIND, "ns", "pd")]["spec"]
    spec["engine"] = "sglang"
    for role in ("prefill", "decode"):
        spec[role]["gpus"] = 1
    return OperatorState(client=kube, workers=workers, admin=workers, token_key=KEY, pair=pair)


def until_found(state: OperatorState, kube: KubeFake, limit: int = 40) -> None:
    """Cycles until the status shows a finding, or a canary was sent (each cycle one scrape,
    STEP seconds of the pods' clock)."""
    for _ in range(limit):
        cycles(state, kube, 1)
        if (kube.obj(KIND, "ns", "pd").get("status") or {}).get("wedges") or history(kube):
            return
    raise AssertionError("nothing found")


def test_a_prefill_whose_transfers_keep_failing_is_restarted_once_kv_canaries_confirm_it(
    kube: KubeFake,
) -> None:
    """TransfersFailing is a suspicion: its prefill gets a pair canary, and a KV request that
    does not complete while both sides answer is asked again at once (failureThreshold 2);
    two in a row confirm it and the prefill is restarted, with the evidence in the ledger."""
    workers = FailingTransfers(failing={"pd-prefill-0"})
    pair = PairFake(outcomes={("pd-prefill-0", "pd-decode-0"): "alive"}, kv_sent=True)
    state = sglang_setup(kube, workers, pair)
    until_found(state, kube)
    assert pair.asked == [("pd-prefill-0", "pd-decode-0")] * 2  # confirmed in one cycle
    [entry] = history(kube)
    assert (entry["action"], entry["pod"]) == ("RestartPrefill", "pd-prefill-0")
    assert entry["reason"].startswith("TransfersFailing: ")
    assert "none succeeded" in entry["reason"]
    assert "confirmed: 2 pair canaries in a row moved no KV" in entry["reason"]
    assert ("Pod", "ns", "pd-prefill-0") not in kube.objects


def test_failing_transfers_through_a_pair_whose_kv_canary_decodes_draw_nothing(
    kube: KubeFake,
) -> None:
    """The same failures (client aborts count as failures too) while a canary's KV request
    through the pair completes: the path works; no finding, no Event, no action."""
    workers = FailingTransfers(failing={"pd-prefill-0"})
    pair = PairFake(kv_sent=True)  # every canary decodes
    state = sglang_setup(kube, workers, pair)
    for _ in range(30):
        cycles(state, kube, 1)
        if pair.asked:
            break
    assert pair.asked == [("pd-prefill-0", "pd-decode-0")]
    cycles(state, kube, 3)
    assert history(kube) == []
    assert not (kube.obj(KIND, "ns", "pd").get("status") or {}).get("wedges")
    assert [e for e in kube.events if e["reason"] == "WedgeDetected"] == []
