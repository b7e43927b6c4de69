"""Detection on stock SGLang: wedge = a queue without progress, never a queue alone.

Every sample here is parsed from a /metrics body in SGLang's real exposition format (see
sglang_bodies.py: prometheus-client multiprocess output with sglang 0.5.23's names and labels,
two DP ranks, priority scheduling). The engine is simulated: the numbers follow what the
source says moves when (`realtime_tokens_total{mode="decode"}` per decode step,
`generation_tokens_total` and `num_requests_total` only when a request finishes,
`per_stage_req_latency_seconds{stage=...}` once per room leaving a transfer queue).
Scrapes every 5 s, wedgeAfterSeconds 60, as in the default spec.
"""

from __future__ import annotations

from dataclasses import replace

from sglang_bodies import body, series

from pdwarden.engines.sglang import PAIR_CANARY
from pdwarden.remediation.detect.evidence import PodView
from pdwarden.remediation.detect.rules import detect
from pdwarden.remediation.memory import organic
from pdwarden.remediation.scrape.samples import parse_metrics

WEDGE_AFTER = 60.0
TEN_MINUTES = 121  # samples 5 s apart


def pod(name: str, role: str, history: tuple, stale: bool = False) -> PodView:  # type: ignore[type-arg]
    return PodView(name, role, f"uid-{name}", history, None, stale)


def idle_prefill(n: int) -> PodView:
    return pod("p-0", "prefill", series("prefill", n, prefill_tokens=5000, sent=40, finished=40))


def judge_every_cycle(*pods: PodView) -> list[tuple[int, str, str]]:
    """detect() as the operator runs it: after every scrape, on the history so far."""
    n = len(pods[0].history)
    found = []
    for i in range(2, n + 1):
        views = [PodView(p.name, p.role, p.uid, p.history[:i], None, p.stale) for p in pods]
        found += [(i, f.pod, f.reason) for f in detect(views, WEDGE_AFTER).findings]
    return found


# -- false positives that SGLang's real semantics would cause ------------------------------


def test_healthy_decode_with_four_long_requests_for_ten_minutes() -> None:
    """800 tok/s for four requests that never finish inside the window: the finish-only
    counters (generation_tokens_total, num_requests_total) stay flat for all ten minutes."""
    decode = pod("d-0", "decode", series(
        "decode", TEN_MINUTES, running=4, prealloc=0, transfer=0, throughput=800.0,
        decode_tokens=lambda i: 1_000_000 + 4000 * i, generation_tokens_total=8080,
        finished=120, arrived=150,
    ))  # fmt: skip
    assert judge_every_cycle(idle_prefill(TEN_MINUTES), decode) == []
    d = detect([idle_prefill(TEN_MINUTES), decode], WEDGE_AFTER)
    assert d.healthy_decodes == {"d-0"}


def test_healthy_decode_between_throughput_reports() -> None:
    """gen_throughput is refreshed only every decode_log_interval steps; per-step tokens are
    what proves progress when it reads 0 (e.g. after the 30 s staleness decay)."""
    decode = pod("d-0", "decode", series(
        "decode", 30, running=4, throughput=0.0, decode_tokens=lambda i: 500 + 40 * i,
    ))  # fmt: skip
    assert judge_every_cycle(idle_prefill(30), decode) == []


def test_saturated_healthy_prefill_whose_inflight_gauge_never_reaches_zero() -> None:
    prefill = pod("p-0", "prefill", series(
        "prefill", TEN_MINUTES, inflight=lambda i: 2 + i % 5, bootstrap=3, waiting=4, running=2,
        sent=lambda i: 100 + 30 * i, finished=lambda i: 100 + 30 * i,
        prefill_tokens=lambda i: 10**6 + 50_000 * i,
    ))  # fmt: skip
    decode = pod("d-0", "decode", series(
        "decode", TEN_MINUTES, running=32, transfer=lambda i: 1 + i % 3, prealloc=2,
        throughput=2500.0, decode_tokens=lambda i: 12_500 * i, arrived=lambda i: 30 * i,
    ))  # fmt: skip
    assert judge_every_cycle(prefill, decode) == []


def test_prefill_rooms_waiting_for_a_busy_decode_short_of_kv_slots() -> None:
    """Optimistic prefill parks rooms until decode allocates: backpressure, not a wedge."""
    prefill = pod("p-0", "prefill", series(
        "prefill", 40, inflight=3, sent=500, finished=500, prefill_tokens=10**6,
    ))  # fmt: skip
    decode = pod("d-0", "decode", series(
        "decode", 40, running=64, prealloc=3, throughput=3000.0,
        decode_tokens=lambda i: 15_000 * i,
    ))  # fmt: skip
    assert judge_every_cycle(prefill, decode) == []


def test_decode_waiting_for_a_long_prefill_is_not_stalled() -> None:
    """The decode's transfer queue waits while the prefill still computes a long prompt."""
    prefill = pod("p-0", "prefill", series(
        "prefill", 40, running=1, inflight=0, prefill_tokens=lambda i: 8192 * i,
    ))  # fmt: skip
    decode = pod("d-0", "decode", series("decode", 40, running=0, transfer=1, throughput=0.0))
    assert judge_every_cycle(prefill, decode) == []


# -- the wedges ----------------------------------------------------------------------------


def test_prefill_whose_inflight_rooms_stop_draining_while_decode_is_idle() -> None:
    """Healthy for a minute, then three rooms stay in the inflight queue and nothing leaves."""
    n = 40
    sent = [100 + 10 * i for i in range(12)] + [210] * (n - 12)
    prefill = pod("p-0", "prefill", series(
        "prefill", n, inflight=[2] * 12 + [3] * (n - 12), sent=sent, finished=sent,
        prefill_tokens=[5000 * i for i in range(12)] + [55_000] * (n - 12),
    ))  # fmt: skip
    decode = pod("d-0", "decode", series(
        "decode", n, running=0, transfer=0, prealloc=0, throughput=0.0, decode_tokens=77_000,
    ))  # fmt: skip
    found = judge_every_cycle(prefill, decode)
    # Last room left at sample 12 (t=55 s); the window of 60 s without any drain ends at 24.
    assert found[0] == (24, "p-0", "InflightGaugeStuck")
    assert {r for _, _, r in found} == {"InflightGaugeStuck"}
    (f,) = detect([prefill, decode], WEDGE_AFTER).findings
    assert (f.room_count, f.peer, f.rooms, f.oldest_seconds) == (3, None, (), 60)
    assert f.evidence == (
        "inflight queue held >= 3 rooms for 60s and none left it "
        "(no KV transfer finished or failed); no decode pod is busy with a backlog"
    )
    assert detect([prefill, decode], WEDGE_AFTER).wedged_rooms == 3


def test_a_wedged_prefill_plus_kv_canaries_is_still_a_wedged_prefill() -> None:
    """The pair canary's KV request through a wedged prefill (to another decode, say) is one real
    transfer the prefill observes: raw, it drains the queue; less what the canaries sent
    (`memory.organic`, `PAIR_CANARY.effects`), the queue still never drains."""
    n = 40
    sent = [100 + 10 * i for i in range(12)] + [210] * (n - 12)
    canaries = (20, 30)  # two KV canaries, each seen by the scrapes after it
    raw_sent = [x + sum(i >= c for c in canaries) for i, x in enumerate(sent)]
    history = series("prefill", n, inflight=[2] * 12 + [3] * (n - 12), sent=raw_sent,
                     finished=sent)  # fmt: skip
    decode = pod("d-0", "decode", series("decode", n, throughput=0.0, decode_tokens=77_000))
    raw = pod("p-0", "prefill", history)
    assert detect([raw, decode], WEDGE_AFTER).findings == ()  # the canaries read as a drain
    effects = [(history[c].at - 1.0, PAIR_CANARY.effects["prefill"]) for c in canaries]
    fixed = pod("p-0", "prefill", organic(history, effects))
    (f,) = detect([fixed, decode], WEDGE_AFTER).findings
    assert (f.pod, f.reason) == ("p-0", "InflightGaugeStuck")


def never_failed(role: str, rows: list[dict[str, float]]) -> tuple:  # type: ignore[type-arg]
    """Samples 5 s apart as a server that never failed a request shows them: SGLang creates
    `num_{bootstrap,transfer}_failed_reqs_total` at the first failure (seen on the real pair)."""
    return tuple(
        parse_metrics(
            "\n".join(ln for ln in body(role, **row).split("\n") if "_failed_reqs_" not in ln),
            1000.0 + 5 * i,
            engine="sglang",
        )
        for i, row in enumerate(rows)
    )


def test_a_server_that_never_failed_is_judged_from_what_it_shows() -> None:
    """No failure counters on /metrics: an idle or busy prefill draws nothing for their absence,
    and a wedged prefill is still found from its other drain counters, at the same scrape as
    with them."""
    n = 40
    sent = [100 + 10 * i for i in range(12)] + [210] * (n - 12)
    inflight = [2] * 12 + [3] * (n - 12)
    decode = pod("d-0", "decode", never_failed("decode", [
        {"decode_tokens": 77_000, "throughput": 0.0}] * n))  # fmt: skip
    rows = [{"inflight": inflight[i], "sent": sent[i], "finished": sent[i]} for i in range(n)]
    wedged = pod("p-0", "prefill", never_failed("prefill", rows))
    assert wedged.history[-1].failed is None  # absent, not 0
    assert judge_every_cycle(wedged, decode)[0] == (24, "p-0", "InflightGaugeStuck")
    busy = pod("p-0", "prefill", never_failed("prefill", [
        {"inflight": 2, "sent": 10 * i, "finished": 10 * i} for i in range(n)]))  # fmt: skip
    idle = pod("p-0", "prefill", never_failed("prefill", [{"sent": 40, "finished": 40}] * n))
    for prefill in (busy, idle):
        assert judge_every_cycle(prefill, decode) == []


def test_a_failing_transfer_is_a_drain_not_a_wedge() -> None:
    """Rooms that fail leave the queue: no InflightGaugeStuck. Failures that keep coming while
    none succeeds are their own suspicion (below)."""
    prefill = pod("p-0", "prefill", series(
        "prefill", 20, inflight=2, sent=40, finished=40, transfer_failed=lambda i: i // 4,
    ))  # fmt: skip
    decode = pod("d-0", "decode", series("decode", 20, throughput=0.0, decode_tokens=1))
    assert [f.reason for f in detect([prefill, decode], WEDGE_AFTER).findings] == [
        "TransfersFailing"
    ]


# -- TransfersFailing: the KV path broke while both sides stay up ---------------------------


def failing_prefill(n: int = 30, broke_at: int = 10, **knobs: object) -> PodView:
    """Transfers succeed until `broke_at`, then every request's fails (some at bootstrap, the
    rest in transfer) while requests keep coming: what a pair with stale peer state shows."""
    rows = dict(
        sent=lambda i: 100 + 4 * min(i, broke_at),
        finished=lambda i: 100 + 4 * i,
        bootstrap_failed=lambda i: max(i - broke_at, 0),
        transfer_failed=lambda i: 3 * max(i - broke_at, 0),
    )
    return pod("p-0", "prefill", series("prefill", n, **{**rows, **knobs}))  # type: ignore[arg-type]


def idle_decode(n: int = 30) -> PodView:
    return pod("d-0", "decode", series("decode", n, throughput=0.0, decode_tokens=5000))


def test_transfers_that_keep_failing_while_every_decode_is_in_sight() -> None:
    found = judge_every_cycle(failing_prefill(), idle_decode())
    # A window (60 s: 12 scrapes) after the first failure, then every cycle while it lasts.
    assert found and found[0] == (23, "p-0", "TransfersFailing")
    assert {r for _, _, r in found} == {"TransfersFailing"}
    (f,) = detect([failing_prefill(), idle_decode()], WEDGE_AFTER).findings
    assert (f.peer, f.confirmed, f.room_count) == ("d-0", False, 0)
    assert f.evidence == (
        "48 KV transfers failed at 12 scrapes in 60s and none succeeded (transfers flat at "
        "140) while every decode pod was in sight"
    )


def test_failures_among_transfers_that_succeed_are_client_aborts() -> None:
    """Measured on the real pair: a third of clients hanging up count as failures while the
    other requests' KV keeps moving. Nothing to find."""
    storm = failing_prefill(sent=lambda i: 100 + 4 * i)
    assert judge_every_cycle(storm, idle_decode()) == []


def test_one_burst_of_failures_is_not_a_broken_path() -> None:
    """pdwarden's own AbortRequests, or a decode's death, fails every room at one moment."""
    burst = failing_prefill(bootstrap_failed=lambda i: 0,
                            transfer_failed=lambda i: 9 if i >= 20 else 0)  # fmt: skip
    assert judge_every_cycle(burst, idle_decode()) == []


def test_failures_while_a_decode_is_away_are_the_decodes_absence() -> None:
    """The real killed-decode scenario: the prefill counts bootstrap failures while its decode
    is gone (70 s here), and transfers succeed again once it is back; the kubelet repairs that,
    not pdwarden. Had they kept failing, the path would be broken: found a window later."""
    away, back = 12, 26
    h = idle_decode(50).history
    holed = replace(idle_decode(50), history=h[:away] + h[back:])

    def found(prefill: PodView) -> list[int]:
        out = []
        for i in range(3, 51):
            until = prefill.history[i - 1].at
            seen = tuple(s for s in holed.history if s.at <= until)
            # Its scrape failed this cycle while it is away: stale (memory.is_stale).
            views = [
                replace(prefill, history=prefill.history[:i]),
                replace(holed, history=seen, stale=seen[-1].at < until),
            ]
            out += [i for f in detect(views, WEDGE_AFTER).findings]
        return out  # fmt: skip

    healed = failing_prefill(
        50, broke_at=away, sent=lambda i: 100 + 4 * min(i, away) + 4 * max(i - back, 0),
        bootstrap_failed=lambda i: min(max(i - away, 0), back - away), transfer_failed=0,
    )  # fmt: skip
    assert found(healed) == []
    still_broken = failing_prefill(50, broke_at=away)
    assert found(still_broken)[0] == back + 10  # the hole is out of the 60 s window
    stale = replace(idle_decode(50), stale=True)
    assert detect([still_broken, stale], WEDGE_AFTER).findings == ()


def test_a_failed_kv_canary_is_no_users_failure() -> None:
    """The pair canary's KV request through a pair whose path broke fails too, once per canary
    (`PAIR_CANARY.failed_effects`): less what the canaries owe, an idle pair's failures are
    none, so canaries alone never make the finding they confirm."""
    n = 30
    canaries = (14, 16, 18, 20, 24, 26)
    raw = series("prefill", n, sent=140, finished=140,
                 transfer_failed=lambda i: sum(i >= c for c in canaries))  # fmt: skip
    raw_pod = pod("p-0", "prefill", raw)
    assert [f.reason for f in detect([raw_pod, idle_decode()], WEDGE_AFTER).findings] == [
        "TransfersFailing"
    ]
    owed = {**PAIR_CANARY.effects["prefill"], **PAIR_CANARY.failed_effects["prefill"]}
    effects = [(raw[c].at - 1.0, owed) for c in canaries]
    fixed = pod("p-0", "prefill", organic(raw, effects))
    assert detect([fixed, idle_decode()], WEDGE_AFTER).findings == ()


def test_no_gauge_finding_while_a_decode_is_unknown() -> None:
    prefill = pod("p-0", "prefill", series("prefill", 20, inflight=3, sent=40, finished=40))
    decode = pod("d-0", "decode", series("decode", 20, throughput=0.0), stale=True)
    d = detect([prefill, decode], WEDGE_AFTER)
    assert d.findings == () and d.unknown == ("d-0: no fresh metrics",)


def test_decode_with_a_transfer_queue_and_zero_throughput() -> None:
    prefill = idle_prefill(20)
    decode = pod("d-0", "decode", series(
        "decode", 20, running=0, transfer=4, throughput=0.0, decode_tokens=77_000, arrived=150,
        generation_tokens_total=8080,
    ))  # fmt: skip
    d = detect([prefill, decode], WEDGE_AFTER)
    (f,) = d.findings
    assert (f.reason, f.pod, f.room_count) == ("DecodeStalled", "d-0", 4)
    assert "transfer queue 4" in f.evidence and "generated tokens flat at 77000" in f.evidence
    assert d.stalled_decodes == {"d-0"}


def test_decode_with_running_requests_and_no_step_progress() -> None:
    decode = pod("d-0", "decode", series(
        "decode", 20, running=4, throughput=0.0, decode_tokens=77_000, arrived=lambda i: i,
    ))  # fmt: skip
    (f,) = detect([idle_prefill(20), decode], WEDGE_AFTER).findings
    assert f.reason == "DecodeStalled" and "running 4" in f.evidence


def test_a_hung_scheduler_freezes_its_throughput_gauge() -> None:
    """Gauges are written by the scheduler loop: if it hangs, gen_throughput keeps its last
    value. The per-step token counter, flat for the window, is what tells."""
    decode = pod("d-0", "decode", series(
        "decode", 20, running=4, throughput=800.0, decode_tokens=77_000,
    ))  # fmt: skip
    (f,) = detect([idle_prefill(20), decode], WEDGE_AFTER).findings
    assert f.reason == "DecodeStalled" and "generated tokens flat at 77000" in f.evidence


# -- health-check probes are traffic (issue 25) --------------------------------------------
# SGLang 0.5.23's /health runs a one-token request through the scheduler against a fake KV
# peer whenever nothing runs or waits, wedged disaggregation queues included. Each probe moves
# per_stage_req_latency_seconds{stage="prefill_transfer_kv_cache"} and
# realtime_tokens_total{mode="prefill_compute"} (+1 token) on a prefill, republishes its gauges
# as the probe's batch (running 1, the probe counted inflight), and moves
# {stage="decode_transferred"} on a decode. Probed every 10 s, scraped every 5 s.


def probes(i: int) -> int:
    return i // 2


def test_prefill_wedged_for_ten_minutes_while_probed_every_ten_seconds_is_flagged() -> None:
    wedged = 3
    prefill = pod("p-0", "prefill", series(
        "prefill", TEN_MINUTES, inflight=wedged + 1, running=1, sent=210, finished=210,
        probe_sent=lambda i: 210 + probes(i), prefill_tokens=lambda i: 55_000 + probes(i),
    ))  # fmt: skip
    decode = pod("d-0", "decode", series(
        "decode", TEN_MINUTES, throughput=0.0, decode_tokens=77_000,
        arrived=lambda i: 150 + probes(i),
    ))  # fmt: skip
    found = judge_every_cycle(prefill, decode)
    # Flagged from the first full window on, in every cycle for the whole ten minutes.
    flagged = [i for i, name, reason in found if (name, reason) == ("p-0", "InflightGaugeStuck")]
    assert flagged == list(range(13, TEN_MINUTES + 1))  # 13 samples span 60 s
    (f,) = detect([prefill, decode], WEDGE_AFTER).findings
    assert f.room_count == wedged + 1  # the gauge still counts the last probe (its batch)


def test_decode_stalled_for_ten_minutes_while_probed_every_ten_seconds_is_flagged() -> None:
    prefill = pod("p-0", "prefill", series(
        "prefill", TEN_MINUTES, sent=40, finished=40, prefill_tokens=lambda i: 5000 + probes(i),
        probe_sent=lambda i: 40 + probes(i),
    ))  # fmt: skip
    decode = pod("d-0", "decode", series(
        "decode", TEN_MINUTES, running=0, transfer=4, throughput=0.0, decode_tokens=77_000,
        arrived=lambda i: 150 + probes(i), finished=120,
    ))  # fmt: skip
    found = judge_every_cycle(prefill, decode)
    flagged = [i for i, name, reason in found if (name, reason) == ("d-0", "DecodeStalled")]
    assert flagged == list(range(13, TEN_MINUTES + 1))  # 13 samples span 60 s


def test_a_probed_idle_prefill_still_counts_as_idle() -> None:
    """A probe computes one prompt token on an idle prefill and leaves at once (SGLang
    republishes the idle gauges right after): nobody's long prefill, the decode is judged."""
    prefill = pod("p-0", "prefill", series(
        "prefill", 20, sent=40, finished=40, prefill_tokens=lambda i: 5000 + probes(i),
        probe_sent=lambda i: 40 + probes(i),
    ))  # fmt: skip
    decode = pod("d-0", "decode", series(
        "decode", 20, transfer=2, throughput=0.0, decode_tokens=77_000, finished=120,
    ))  # fmt: skip
    (f,) = detect([prefill, decode], WEDGE_AFTER).findings
    assert (f.pod, f.reason) == ("d-0", "DecodeStalled")


# -- the decode-backlog excuse only where SGLang can produce it (issue 25) ------------------


def busy_decode_short_of_slots(n: int) -> PodView:
    return pod("d-0", "decode", series(
        "decode", n, running=64, prealloc=3, throughput=3000.0,
        decode_tokens=lambda i: 15_000 * i,
    ))  # fmt: skip


def test_default_prefill_settings_get_no_decode_backlog_excuse() -> None:
    """With SGLang's defaults a request's room enters the inflight queue only after its decode
    allocated KV (a /health probe's fake room waits on no decode at all): a busy decode short of
    slots cannot be why rooms stay there."""
    history = series("prefill", 40, inflight=3, sent=500, finished=500)
    prefill = PodView("p-0", "prefill", "uid-p-0", history, rooms_wait_for_decode_kv=False)
    (f,) = detect([prefill, busy_decode_short_of_slots(40)], WEDGE_AFTER).findings
    assert (f.pod, f.reason, f.room_count) == ("p-0", "InflightGaugeStuck", 3)
    assert f.evidence.endswith(
        "this prefill never parks a room there to wait for its decode's KV slots"
    )


def test_optimistic_prefill_keeps_the_decode_backlog_excuse() -> None:
    history = series("prefill", 40, inflight=3, sent=500, finished=500)
    prefill = PodView("p-0", "prefill", "uid-p-0", history, rooms_wait_for_decode_kv=True)
    assert detect([prefill, busy_decode_short_of_slots(40)], WEDGE_AFTER).findings == ()


def test_a_decode_out_of_sight_leaves_a_prefills_gauge_unjudged() -> None:
    """Seen on the real SGLang pair: while a decode is away (killed, restarting, unreachable)
    the prefill's gauges keep their last snapshot, so a stuck-looking inflight gauge proves
    nothing about the prefill, whatever its settings; the decode is judged on its own."""
    history = series("prefill", 40, inflight=3, sent=500, finished=500)
    for waits in (False, True):
        prefill = PodView("p-0", "prefill", "uid-p-0", history, rooms_wait_for_decode_kv=waits)
        away = replace(busy_decode_short_of_slots(40), stale=True)
        assert detect([prefill, away], WEDGE_AFTER).findings == (), waits
        late = busy_decode_short_of_slots(40)
        late = replace(late, history=late.history[-3:])  # back only since the window began
        assert detect([prefill, late], WEDGE_AFTER).findings == (), waits
        # Killed and back within the window: a hole in its samples.
        h = busy_decode_short_of_slots(40).history
        holed = replace(late, history=h[:-12] + h[-2:])
        assert detect([prefill, holed], WEDGE_AFTER).findings == (), waits
    # In sight all along (the test above): the gauge is judged.
    prefill = PodView("p-0", "prefill", "uid-p-0", history, rooms_wait_for_decode_kv=False)
    (f,) = detect([prefill, busy_decode_short_of_slots(40)], WEDGE_AFTER).findings
    assert f.reason == "InflightGaugeStuck"
