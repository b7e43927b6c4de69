"""decide.pairs and memory.organic: who a pair canary asks, what its outcome means, and that a
canary never reads as progress (a frozen pod plus canaries is still a frozen pod)."""

from __future__ import annotations

from dataclasses import replace

from pdwarden.remediation.decide.pairs import (
    MAX_PAIRS,
    ask_again,
    ask_kv_again,
    held_dead,
    judged,
    kv_counts,
    pairs_to_ask,
    still,
    with_pair_outcomes,
)
from pdwarden.remediation.detect.evidence import Finding, PodView
from pdwarden.remediation.detect.pull import kv_read_stuck
from pdwarden.remediation.detect.rules import Detection
from pdwarden.remediation.memory import organic
from pdwarden.values import CanaryResult, PairResult, Sample

QUIET = 10.0


def flat(
    role: str, seconds: float = 12.0, step: float = 2.0, **fields: float
) -> tuple[Sample, ...]:
    """Samples every `step` seconds over `seconds`, every counter standing still."""
    n = int(seconds / step) + 1
    base = {"prefill_tokens": 100.0, "generated_tokens": 50.0, "completed": 5.0, **fields}
    return tuple(Sample(at=100.0 + i * step, **base) for i in range(n))


def busy(role: str, seconds: float = 12.0, step: float = 2.0) -> tuple[Sample, ...]:
    n = int(seconds / step) + 1
    return tuple(
        Sample(at=100.0 + i * step, prefill_tokens=100.0 + 10 * i, generated_tokens=50.0 + 5 * i)
        for i in range(n)
    )


def view(name: str, role: str, history: tuple[Sample, ...], stale: bool = False) -> PodView:
    return PodView(name=name, role=role, uid=f"uid-{name}", history=history, stale=stale)


def test_a_pod_whose_counters_stood_still_since_its_last_scrape_is_still() -> None:
    assert still(view("d", "decode", flat("decode")))
    assert not still(view("d", "decode", busy("decode")))
    stopped = (*busy("decode")[:-1], replace(busy("decode")[-2], at=112.0))
    assert still(view("d", "decode", stopped))  # moving until the last scrape: still at once
    working = flat("decode", seconds=5, step=5, running=1.0, reading_queue=1.0)
    assert still(view("d", "decode", working))  # work or none: the counters decide


def test_a_pod_seen_once_or_stale_is_not_judged() -> None:
    assert not still(view("d", "decode", flat("decode")[:1]))
    assert not still(view("d", "decode", flat("decode"), stale=True))
    assert not still(view("d", "decode", ()))


def test_a_still_pod_is_paired_with_a_partner_proven_alive() -> None:
    views = [
        view("p-0", "prefill", busy("prefill")),
        view("p-1", "prefill", flat("prefill")),
        view("d-0", "decode", busy("decode")),
    ]
    assert pairs_to_ask(views, {}, now=1000.0, seconds=QUIET) == [("p-1", "d-0")]


def test_an_idle_pairs_two_still_pods_are_asked_together_once() -> None:
    views = [view("p-0", "prefill", flat("prefill")), view("d-0", "decode", flat("decode"))]
    assert pairs_to_ask(views, {}, now=1000.0, seconds=QUIET) == [("p-0", "d-0")]


def test_a_pod_asked_within_the_window_is_not_asked_again() -> None:
    views = [view("p-0", "prefill", flat("prefill")), view("d-0", "decode", flat("decode"))]
    asked = {"p-0": 995.0, "d-0": 995.0}
    assert pairs_to_ask(views, asked, now=1000.0, seconds=QUIET) == []
    assert pairs_to_ask(views, asked, now=1006.0, seconds=QUIET) == [("p-0", "d-0")]


def test_no_partner_no_canary_and_at_most_max_pairs_a_cycle() -> None:
    assert pairs_to_ask([view("p-0", "prefill", flat("prefill"))], {}, 1000.0, QUIET) == []
    views = [view(f"p-{i}", "prefill", flat("prefill")) for i in range(5)]
    views += [view(f"d-{i}", "decode", flat("decode")) for i in range(5)]
    assert len(pairs_to_ask(views, {}, 1000.0, QUIET)) == MAX_PAIRS


def test_a_stale_pod_is_neither_asked_nor_a_partner() -> None:
    views = [
        view("p-0", "prefill", flat("prefill")),
        view("d-0", "decode", flat("decode"), stale=True),
    ]
    assert pairs_to_ask(views, {}, 1000.0, QUIET) == []


def test_decode_dead_makes_the_decode_dead_for_the_ladder() -> None:
    got = with_pair_outcomes(
        Detection(healthy_decodes=frozenset({"d-0"})),
        [PairResult("p-0", "d-0", "decode_dead", "decode leg: no answer")],
    )
    assert got.dead_decodes == {"d-0"} and "d-0" in got.stalled_decodes
    assert "d-0" not in got.healthy_decodes
    [f] = got.findings  # announced once as a wedge (WedgeDetected), repaired by rungs 2-4
    assert (f.pod, f.role, f.reason) == ("d-0", "decode", "DecodeDead")


def test_a_decode_dead_by_its_last_canaries_stays_dead_while_still_and_unasked() -> None:
    views = [
        view("d-0", "decode", flat("decode")),
        view("d-1", "decode", busy("decode")),  # its counters move again: not held
        view("d-2", "decode", flat("decode")),  # asked this cycle: its own outcome counts
        view("d-3", "decode", flat("decode")),  # below the threshold: a suspect, not dead
        view("p-0", "prefill", flat("prefill")),  # a prefill's repair is one action: not held
    ]
    misses = {"d-0": 2, "d-1": 2, "d-2": 2, "d-3": 1, "p-0": 2}
    assert held_dead(views, misses, 2, {"d-2", "p-0"}) == {"d-0": 2}
    got = with_pair_outcomes(Detection(healthy_decodes=frozenset({"d-0"})), [], {"d-0": 2})
    assert got.dead_decodes == {"d-0"} and "d-0" not in got.healthy_decodes
    [f] = got.findings
    assert (f.pod, f.reason) == ("d-0", "DecodeDead") and "last 2 canaries" in f.evidence


def test_prefill_dead_is_a_prefill_dead_finding_on_the_prefill() -> None:
    got = with_pair_outcomes(
        Detection(), [PairResult("p-0", "d-0", "prefill_dead", "prefill leg: no answer")]
    )
    [f] = got.findings
    assert (f.pod, f.role, f.reason) == ("p-0", "prefill", "PrefillDead")
    assert "d-0" in f.evidence and got.dead_decodes == frozenset()


def test_a_healthy_side_waiting_on_a_dead_one_has_no_finding_of_its_own() -> None:
    """SGLang: a frozen prefill leaves the decode's gauges showing requests running, so the
    decode reads as stalled; the canary that found the prefill dead heard the decode answer."""
    stalled = Finding(pod="d-0", role="decode", reason="DecodeStalled", evidence="flat")
    before = Detection(findings=(stalled,), stalled_decodes=frozenset({"d-0"}))
    dead = PairResult("p-0", "d-0", "prefill_dead", "no answer", decode_answered=True)
    got = with_pair_outcomes(before, [dead])
    assert [(f.pod, f.reason) for f in got.findings] == [("p-0", "PrefillDead")]
    assert got.stalled_decodes == frozenset()
    # A decode that did not answer that canary keeps its own finding.
    silent = with_pair_outcomes(before, [replace(dead, decode_answered=False)])
    assert {(f.pod, f.reason) for f in silent.findings} == {
        ("p-0", "PrefillDead"), ("d-0", "DecodeStalled")}  # fmt: skip
    assert silent.stalled_decodes == {"d-0"}
    gauge = Finding(pod="p-0", role="prefill", reason="InflightGaugeStuck", evidence="flat")
    decode_dead = with_pair_outcomes(
        Detection(findings=(gauge,)), [PairResult("p-0", "d-0", "decode_dead", "no answer")]
    )
    assert [(f.pod, f.reason) for f in decode_dead.findings] == [("d-0", "DecodeDead")]
    alive = with_pair_outcomes(before, [PairResult("p-0", "d-0", "alive", "both answered")])
    assert alive.canaries["d-0"].verdict == "alive" and alive.findings == (stalled,)


def test_unknown_proves_nothing_and_decoded_only_notes_the_decode_alive() -> None:
    before = Detection(healthy_decodes=frozenset({"d-0"}))
    unknown = with_pair_outcomes(before, [PairResult("p-0", "d-0", "unknown", "HTTP 401")])
    assert unknown.findings == () and unknown.canaries == {} and unknown.stalled_decodes == set()
    decoded = with_pair_outcomes(before, [PairResult("p-0", "d-0", "decoded", "0.2s")])
    assert decoded.canaries["d-0"].verdict == "alive" and decoded.dead_decodes == frozenset()
    dead = {"d-0": CanaryResult("d-0", "dead", "one-token canary")}
    kept = with_pair_outcomes(Detection(canaries=dead), [PairResult("p-0", "d-0", "decoded", "")])
    assert kept.canaries["d-0"].verdict == "dead"  # a decode canary's dead is never overwritten


def test_a_dead_side_is_a_suspect_until_it_missed_threshold_canaries_in_a_row() -> None:
    dead = PairResult("p-0", "d-0", "prefill_dead", "prefill leg: no answer")
    [first], counts = judged([dead], {}, 2)
    assert (
        first.outcome == "suspect" and "1 of 2" in first.detail and counts == {"p-0": 1, "d-0": 0}
    )
    [second], counts = judged([dead], counts, 2)
    assert second.outcome == "prefill_dead" and "2 canaries in a row" in second.detail
    assert counts["p-0"] == 2
    [once], _ = judged([dead], {}, 1)  # threshold 1: the first miss acts, as before
    assert once == dead


def test_a_miss_below_the_threshold_is_asked_again_at_once_and_only_then() -> None:
    dead = PairResult("p-0", "d-0", "prefill_dead", "prefill leg: no answer")
    ok = PairResult("p-0", "d-0", "decoded", "0.2s", prefill_answered=True, decode_answered=True)
    assert ask_again([dead], {}, 2) and not ask_again([dead, dead], {}, 2)
    assert not ask_again([dead], {"p-0": 1}, 2)  # one miss remembered from an earlier cycle
    assert ask_again([dead, dead], {}, 3) and not ask_again([dead, ok], {}, 2)
    assert not ask_again([dead], {}, 1) and not ask_again([], {}, 2)
    unknown = PairResult("p-0", "d-0", "unknown", "HTTP 401")
    assert not ask_again([dead, unknown], {}, 3)  # unknown proves nothing: not asked again


def test_an_answer_starts_the_count_again_and_unknown_leaves_it() -> None:
    decode_dead = PairResult("p-0", "d-0", "decode_dead", "decode leg", prefill_answered=True)
    _, counts = judged([decode_dead], {"p-0": 1, "d-0": 1}, 3)
    assert counts == {"p-0": 0, "d-0": 2}  # the prefill answered; the decode missed again
    unknown = PairResult("p-0", "d-0", "unknown", "HTTP 401")
    [same], kept = judged([unknown], counts, 3)
    assert same == unknown and kept == counts
    ok = PairResult("p-0", "d-0", "decoded", "0.2s", prefill_answered=True, decode_answered=True)
    assert judged([ok], kept, 3)[1] == {"p-0": 0, "d-0": 0}


def test_a_suspect_proves_nothing() -> None:
    suspect = PairResult("p-0", "d-0", "suspect", "decode leg: no answer (suspect: 1 of 2)")
    got = with_pair_outcomes(Detection(healthy_decodes=frozenset({"d-0"})), [suspect])
    assert got.findings == () and got.canaries == {} and got.healthy_decodes == {"d-0"}


def test_a_frozen_pod_plus_canaries_is_still_a_frozen_pod() -> None:
    """What the canaries sent through a frozen decode (answered before it froze, say) moved its
    raw counters; without them it is flat, so it stays still and is asked again."""
    raw = list(flat("decode", kv_transfers=7.0))
    effect = {"prefill_tokens": 4.0, "generated_tokens": 1.0, "completed": 1.0, "kv_transfers": 1.0}
    effects = []
    for i in (2, 4):  # two canaries answered, each seen by the samples after it
        effects.append((raw[i].at - 0.5, effect))
        raw[i:] = [
            Sample(at=s.at, prefill_tokens=(s.prefill_tokens or 0) + 4,
                   generated_tokens=(s.generated_tokens or 0) + 1,
                   completed=(s.completed or 0) + 1, kv_transfers=(s.kv_transfers or 0) + 1)
            for s in raw[i:]
        ]  # fmt: skip
    fixed = organic(raw, effects)
    # raw: the canaries look like work at the scrapes that first show them; organic: still at all
    assert [still(view("d-0", "decode", tuple(raw[: i + 1]))) for i in range(1, len(raw))] == [
        i not in (2, 4) for i in range(1, len(raw))
    ]
    assert all(still(view("d-0", "decode", fixed[: i + 1])) for i in range(1, len(fixed)))


# -- TransfersFailing: a suspicion the KV request confirms -----------------------------------

FAILING = Finding(
    pod="p-0",
    role="prefill",
    reason="TransfersFailing",
    peer="d-0",
    evidence="9 KV transfers failed at 3 scrapes in 45s and none succeeded",
)
NO_KV = PairResult(
    "p-0",
    "d-0",
    "alive",
    "KV request: HTTP 500",
    kv_sent=True,
    prefill_answered=True,
    decode_answered=True,
)
KV_MOVED = PairResult("p-0", "d-0", "decoded", "decoded in 0.2s", kv_sent=True,
                      prefill_answered=True, decode_answered=True)  # fmt: skip


def test_a_prefill_suspected_of_failing_transfers_is_asked_though_it_is_busy() -> None:
    views = [view("p-0", "prefill", busy("prefill")), view("d-0", "decode", busy("decode"))]
    assert pairs_to_ask(views, {}, 200.0, QUIET) == []
    assert pairs_to_ask(views, {}, 200.0, QUIET, confirm={"p-0"}) == [("p-0", "d-0")]
    assert pairs_to_ask(views, {"p-0": 195.0}, 200.0, QUIET, confirm={"p-0"}) == []  # quiet


def test_kv_requests_in_a_row_that_did_not_complete_are_counted_per_prefill() -> None:
    assert kv_counts([NO_KV, NO_KV], {}) == {"p-0": 2}
    assert kv_counts([NO_KV, KV_MOVED], {"p-0": 5}) == {"p-0": 0}  # the KV moved: again at 0
    no_request = replace(NO_KV, kv_sent=False)  # no bootstrap port known: nothing to count
    unknown = replace(NO_KV, outcome="unknown")
    assert kv_counts([no_request, unknown], {"p-0": 1}) == {"p-0": 1}
    dead = PairResult("p-0", "d-0", "decode_dead", "no answer", kv_sent=True)
    assert kv_counts([dead], {}) == {"p-0": 0}  # a dead side is not a broken path


def test_a_suspected_prefill_is_asked_again_at_once_until_the_threshold() -> None:
    assert ask_kv_again([NO_KV], {}, 2, {"p-0"})
    assert not ask_kv_again([NO_KV, NO_KV], {}, 2, {"p-0"})
    assert not ask_kv_again([NO_KV], {"p-0": 1}, 2, {"p-0"})  # the count spans cycles
    assert not ask_kv_again([NO_KV], {}, 2, set())  # nothing to confirm: once a quiet window
    assert not ask_kv_again([KV_MOVED], {}, 2, {"p-0"})


def test_transfers_failing_is_confirmed_by_the_kv_requests_and_dropped_when_one_moves() -> None:
    before = Detection(findings=(FAILING,))
    (f,) = with_pair_outcomes(before, [NO_KV, NO_KV], kv_failures={"p-0": 2}, threshold=2).findings
    assert f.confirmed and f.identity == FAILING.identity
    assert f.evidence == (
        f"{FAILING.evidence}; confirmed: 2 pair canaries in a row moved no KV while both sides "
        "answered their health checks (last with d-0: KV request: HTTP 500)"
    )
    (f,) = with_pair_outcomes(before, [NO_KV], kv_failures={"p-0": 1}, threshold=2).findings
    assert not f.confirmed  # below the threshold: reported, never acted on
    (f,) = with_pair_outcomes(before, [], kv_failures={"p-0": 2}, threshold=2).findings
    assert f.confirmed  # confirmed earlier, no canary through it this cycle
    assert (
        with_pair_outcomes(before, [KV_MOVED], kv_failures={"p-0": 0}, threshold=2).findings == ()
    )
    # A canary's KV moved through it within the wedge window: dropped between canaries too.
    assert with_pair_outcomes(before, [], threshold=2, kv_moved={"p-0"}).findings == ()


def test_a_stuck_read_plus_canaries_is_still_a_stuck_read() -> None:
    """A decode whose KV read is stuck: a canary that read through another prefill adds one
    finished read; without it the read counter is flat and KVReadStuck still names the pod."""
    raw = [Sample(at=100.0 + 5 * i, reading_queue=1.0, kv_transfers=3.0, failed=0.0)
           for i in range(14)]  # fmt: skip
    raw[8:] = [Sample(at=s.at, reading_queue=1.0, kv_transfers=4.0, failed=0.0) for s in raw[8:]]
    effects = [(raw[8].at - 1.0, {"kv_transfers": 1.0})]
    decode = view("d-0", "decode", tuple(raw))
    assert kv_read_stuck(decode, [decode], 60.0) is None  # raw: a read "finished"
    fixed = view("d-0", "decode", organic(raw, effects))
    stuck = kv_read_stuck(fixed, [fixed], 60.0)
    assert stuck is not None and stuck.reason == "KVReadStuck"


def test_organic_leaves_samples_before_a_canary_and_gauges_alone() -> None:
    raw = (Sample(at=1.0, generated_tokens=10.0, running=2.0),
           Sample(at=3.0, generated_tokens=11.0, running=2.0))  # fmt: skip
    out = organic(raw, [(2.0, {"generated_tokens": 1.0, "running": 5.0})])
    assert [s.generated_tokens for s in out] == [10.0, 10.0]
    assert [s.running for s in out] == [2.0, 2.0]  # not a counter: never touched


def _transferred(steps: list[float], start: float = 100.0) -> list[Sample]:
    """A decode's transferred prompt tokens over samples 5 s apart: `steps` added at each."""
    total, out = 1000.0, []
    for i, step in enumerate(steps):
        total += step
        out.append(Sample(at=start + 5 * i, transferred_tokens=total))
    return out


def _values(samples: tuple[Sample, ...]) -> list[float | None]:
    return [s.transferred_tokens for s in samples]


def test_a_canarys_increments_shown_a_scrape_late_or_in_pieces_never_read_as_movement() -> None:
    """Measured on the real vLLM pair under load: a canary that ended before a scrape was not yet
    in that scrape's counters, and its 32 prompt tokens showed as 30, then 2. Taken off when it
    ended, the counter dipped and came back: movement, which hid a decode recomputing every
    prompt (PromptsRecomputed needs the transferred tokens flat for the whole window)."""
    effect = {"transferred_tokens": 32.0}
    late = _transferred([0, 0, 0, 32, 0, 0])  # ended before sample 2, shown at sample 3
    assert set(_values(organic(late, [(late[2].at - 1.0, effect)]))) == {1000.0}
    pieces = _transferred([0, 0, 30, 2, 0, 0])
    assert set(_values(organic(pieces, [(pieces[2].at - 1.0, effect)]))) == {1000.0}
    two = _transferred([0, 32, 0, 32, 0, 0])  # two canaries, shown at once: as before
    fixed = organic(two, [(two[1].at - 0.5, effect), (two[3].at - 0.5, effect)])
    assert set(_values(fixed)) == {1000.0}


def test_a_canary_shown_at_the_first_scrape_after_a_gap_is_still_taken_off() -> None:
    """The pod's scrapes failed for longer than memory.SETTLE_SECONDS after the canary ended (a
    busy engine's /metrics timing out): the first sample that comes back shows its increments,
    and they are still the canary's."""
    effect = {"transferred_tokens": 32.0}
    samples = _transferred([0, 0, 32, 0])
    gap = [samples[0], samples[1], replace(samples[2], at=samples[1].at + 15), samples[3]]
    gap[3] = replace(gap[3], at=gap[2].at + 5)
    assert set(_values(organic(gap, [(gap[1].at + 0.5, effect)]))) == {1000.0}


def test_an_increment_a_canary_never_made_hides_the_pods_own_work_for_seconds_at_most() -> None:
    """A canary whose increments never show up owes nothing after memory.SETTLE_SECONDS: the
    pod's own later transfer reads as movement; and a counter reset (a new process) always does."""
    effect = {"transferred_tokens": 32.0}
    own = _transferred([0, 0, 0, 0, 0, 32])  # canary ended before sample 1, shown never
    assert _values(organic(own, [(own[1].at - 1.0, effect)]))[-1] == 1032.0
    reset = _transferred([0, 0, -1000, 0, 0, 0])
    values = _values(organic(reset, [(reset[1].at - 1.0, effect)]))
    assert values[2] is not None and values[1] is not None and values[2] < values[1]
