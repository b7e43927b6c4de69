"""detection: recorded sample series and room lists -> findings, stalled decodes, unknown pods.

Series are what the scraper records every 5 s (`at` in monotonic seconds); the wedge threshold
is 60 s, as in the default spec.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pdwarden.remediation.detect.evidence import PodView
from pdwarden.remediation.detect.rules import (
    MAX_ROOMS_PER_FINDING,
    MAX_WORKING_PEERS,
    Detection,
    decode_stalled,
    detect,
    working_rooms,
)
from pdwarden.values import RoomView, Sample

WEDGE_AFTER = 60.0
STEP = 5.0


def series(n: int, start: float = 1000.0, **fields: Any) -> tuple[Sample, ...]:
    """n samples STEP apart; a field given as a list varies per sample, a scalar stays fixed."""
    out = []
    for i in range(n):
        values = {k: (v[i] if isinstance(v, list) else v) for k, v in fields.items()}
        out.append(Sample(at=start + i * STEP, **values))
    return tuple(out)


def room(
    n: int, phase: str, seconds: float, peer: str | None = "d-0", inc: str | None = "d0-a"
) -> RoomView:
    return RoomView(n, phase, seconds, peer if phase != "bootstrap" else None, inc)


def prefill(
    rooms: Iterable[RoomView] | None, name: str = "p-0", history: tuple[Sample, ...] | None = None
) -> PodView:
    rooms_t = tuple(rooms) if rooms is not None else None
    inflight = sum(1 for r in rooms_t or () if r.phase == "inflight")
    hist = history if history is not None else series(3, inflight_queue=inflight)
    return PodView(name, "prefill", f"uid-{name}", hist, rooms_t)


def decode(
    name: str = "d-0", incarnation: str | None = "d0-a", history: tuple[Sample, ...] | None = None
) -> PodView:
    hist = history or series(3, incarnation=incarnation, running=1, generated_tokens=[1, 2, 3])
    return PodView(name, "decode", f"uid-{name}", hist)


def decodes() -> list[PodView]:
    return [decode("d-0", "d0-a"), decode("d-1", "d1-a")]


# -- long prefills and young rooms are not wedges ------------------------------------------


def test_long_prefill_is_not_a_wedge() -> None:
    """Rooms waiting for the handshake or still prefilling, far past the threshold: legal."""
    rooms = [room(1, "bootstrap", 600), room(2, "forward", 900), room(3, "forward", 61)]
    d = detect([prefill(rooms), *decodes()], WEDGE_AFTER)
    assert d.findings == () and d.unknown == ()
    assert d.implicated_decodes() == frozenset()


def test_inflight_rooms_below_the_threshold_are_not_wedged() -> None:
    rooms = [room(1, "inflight", 59.9), room(2, "inflight", 60.0), room(3, "inflight", 0.1)]
    assert detect([prefill(rooms), *decodes()], WEDGE_AFTER).findings == ()


# -- InflightStuck -------------------------------------------------------------------------


def test_stuck_rooms_are_grouped_by_decode_peer() -> None:
    rooms = [
        room(30, "inflight", 61, "d-1", "d1-a"),
        room(10, "inflight", 75, "d-0", "d0-a"),
        room(20, "inflight", 90, "d-0", "d0-a"),
        room(40, "inflight", 5, "d-1", "d1-a"),  # young: not wedged
        room(50, "forward", 300),
    ]
    d = detect([prefill(rooms), *decodes()], WEDGE_AFTER)
    assert [(f.reason, f.peer, f.rooms, f.room_count) for f in d.findings] == [
        ("InflightStuck", "d-0", (10, 20), 2),
        ("InflightStuck", "d-1", (30,), 1),
    ]
    first = d.findings[0]
    assert first.pod == "p-0" and first.role == "prefill"
    assert first.oldest_seconds == 90
    assert "2 rooms in the inflight queue longer than 60s" in first.evidence
    assert "oldest 90.0s" in first.evidence and "inflight gauge 4" in first.evidence
    assert d.wedged_rooms == 3
    assert d.implicated_decodes() == {"d-0", "d-1"}
    assert d.stalled_decodes == frozenset()


def test_findings_of_several_prefill_pods() -> None:
    a = prefill([room(1, "inflight", 70)], "p-0")
    b = prefill([room(2, "inflight", 80)], "p-1")
    d = detect([a, b, *decodes()], WEDGE_AFTER)
    assert sorted((f.pod, f.rooms) for f in d.findings) == [("p-0", (1,)), ("p-1", (2,))]


def test_room_ids_in_a_finding_are_bounded_but_counted() -> None:
    rooms = [room(i, "inflight", 100) for i in range(MAX_ROOMS_PER_FINDING + 10)]
    (f,) = detect([prefill(rooms), *decodes()], WEDGE_AFTER).findings
    assert len(f.rooms) == MAX_ROOMS_PER_FINDING
    assert f.room_count == MAX_ROOMS_PER_FINDING + 10


# -- PeerIncarnationGone -------------------------------------------------------------------


def test_decode_incarnation_change_flags_its_rooms_at_once() -> None:
    """The decode restarted: rooms bound to the old process wedge now, not after 60 s."""
    rooms = [
        room(1, "inflight", 0.5, "d-0", "d0-a"),  # young, but its peer is gone
        room(2, "bootstrap", 0.1, "d-0", "d0-a"),
        room(3, "inflight", 0.5, "d-0", "d0-b"),  # bound to the new process: fine
        room(4, "inflight", 0.5, "d-1", "d1-a"),
    ]
    pods = [prefill(rooms), decode("d-0", "d0-b"), decode("d-1", "d1-a")]
    d = detect(pods, WEDGE_AFTER)
    assert [(f.reason, f.peer, f.rooms) for f in d.findings] == [
        ("PeerIncarnationGone", "d-0", (1,))
    ]
    assert "no longer exist" in d.findings[0].evidence
    # The new incarnation of d-0 did nothing wrong: it is not implicated.
    assert d.implicated_decodes() == frozenset()


def test_vanished_decode_pod_flags_its_rooms_at_once() -> None:
    rooms = [room(1, "inflight", 2, "d-9", "d9-a"), room(2, "inflight", 2, "d-0", "d0-a")]
    d = detect([prefill(rooms), *decodes()], WEDGE_AFTER)
    assert [(f.reason, f.peer, f.rooms) for f in d.findings] == [
        ("PeerIncarnationGone", "d-9", (1,))
    ]


def test_gone_rooms_are_not_also_counted_as_stuck() -> None:
    rooms = [room(1, "inflight", 500, "d-0", "d0-a")]
    d = detect([prefill(rooms), decode("d-0", "d0-b")], WEDGE_AFTER)
    assert [f.reason for f in d.findings] == ["PeerIncarnationGone"]
    assert d.wedged_rooms == 1


def test_stale_decode_is_never_judged_gone() -> None:
    """We cannot see d-0's incarnation, so its rooms are only judged by the threshold."""
    stale = PodView("d-0", "decode", "uid-d-0", series(3, incarnation="d0-b"), stale=True)
    rooms = [room(1, "inflight", 5, "d-0", "d0-a"), room(2, "inflight", 70, "d-0", "d0-a")]
    d = detect([prefill(rooms), stale], WEDGE_AFTER)
    assert [(f.reason, f.rooms) for f in d.findings] == [("InflightStuck", (2,))]
    assert d.unknown == ("d-0: no fresh metrics",)


def test_decode_without_an_incarnation_metric_is_never_judged_gone() -> None:
    rooms = [room(1, "inflight", 5, "d-0", "d0-a")]
    d = detect([prefill(rooms), decode("d-0", incarnation=None)], WEDGE_AFTER)
    assert d.findings == ()


# -- InflightGaugeStuck (no rooms API: stock SGLang; SGLang-format series in
#    test_detection_sglang.py) -------------------------------------------------------------


def idle_decode(n: int = 20) -> PodView:
    return decode("d-0", history=series(n, running=0, prealloc_queue=0, generated_tokens=500))


def test_gauge_rule_needs_the_full_window() -> None:
    short = series(12, inflight_queue=3, kv_transfers=10)  # spans 55 s < 60 s
    assert detect([prefill(None, history=short), idle_decode()], WEDGE_AFTER).findings == ()
    full = series(13, inflight_queue=[3] * 6 + [2] * 7, kv_transfers=10)  # 60 s, no drain
    (f,) = detect([prefill(None, history=full), idle_decode()], WEDGE_AFTER).findings
    assert (f.reason, f.room_count, f.oldest_seconds, f.peer) == ("InflightGaugeStuck", 2, 60, None)
    assert f.evidence.startswith("inflight queue held >= 2 rooms for 60s and none left it")


def test_a_queue_that_drains_is_not_stuck_however_full() -> None:
    h = series(40, inflight_queue=5, kv_transfers=[10 + i for i in range(40)])
    assert detect([prefill(None, history=h), idle_decode(40)], WEDGE_AFTER).findings == ()


def test_gauge_that_drained_once_in_the_window_is_not_stuck() -> None:
    h = series(20, inflight_queue=[3] * 10 + [0] + [3] * 9, kv_transfers=10)
    assert detect([prefill(None, history=h), idle_decode()], WEDGE_AFTER).findings == ()
    # ... but once the drain is older than the window, a queue that stopped moving is stuck.
    h = series(20, inflight_queue=[0] + [3] * 19, kv_transfers=10)
    assert [f.reason for f in detect([prefill(None, history=h), idle_decode()], WEDGE_AFTER)
            .findings] == ["InflightGaugeStuck"]  # fmt: skip


def test_an_engine_that_reports_no_drain_counter_is_never_judged() -> None:
    h = series(20, inflight_queue=3)
    assert detect([prefill(None, history=h), idle_decode()], WEDGE_AFTER).findings == ()


# -- DecodeStalled -------------------------------------------------------------------------


def test_decode_stall_transfer_queue_with_flat_tokens() -> None:
    h = series(13, incarnation="d0-a", transfer_queue=2, running=[1] * 13, generated_tokens=500)
    d = detect([decode("d-0", history=h)], WEDGE_AFTER)
    (f,) = d.findings
    assert (f.reason, f.role, f.pod, f.room_count) == ("DecodeStalled", "decode", "d-0", 3)
    assert "generated tokens flat at 500" in f.evidence and "for 60s" in f.evidence
    assert d.stalled_decodes == {"d-0"} and d.implicated_decodes() == {"d-0"}
    assert d.wedged_rooms == 0  # only prefill findings count as wedged rooms


def test_busy_but_progressing_decode_is_not_stalled() -> None:
    tokens = [500 + 40 * i for i in range(13)]
    h = series(13, transfer_queue=2, running=8, generated_tokens=tokens)
    assert detect([decode(history=h)], WEDGE_AFTER).findings == ()


def test_idle_decode_is_not_stalled() -> None:
    h = series(20, transfer_queue=0, prealloc_queue=0, running=0, generated_tokens=500)
    assert detect([decode(history=h)], WEDGE_AFTER).findings == ()


def test_decode_that_emptied_once_in_the_window_is_not_stalled() -> None:
    h = series(13, prealloc_queue=[1] * 6 + [0] + [1] * 6, generated_tokens=500)
    assert decode_stalled(h, WEDGE_AFTER) is None


def test_decode_stall_needs_the_full_window() -> None:
    h = series(12, transfer_queue=2, generated_tokens=500)
    assert decode_stalled(h, WEDGE_AFTER) is None
    assert decode_stalled(h[:1], WEDGE_AFTER) is None


def test_decode_stall_from_throughput_when_there_is_no_token_counter() -> None:
    """An engine that reports a throughput gauge but no per-step token counter (SGLang before
    realtime_tokens_total). Its generation_tokens_total is no substitute: SGLang moves it only
    when a request finishes (observe_one_finished_request), in every version."""
    h = series(13, running=4, throughput=0.0)
    assert "generation throughput 0" in (decode_stalled(h, WEDGE_AFTER) or "")
    h = series(13, running=4, throughput=[0.0] * 12 + [15.0])
    assert decode_stalled(h, WEDGE_AFTER) is None


def test_decode_with_no_progress_metric_is_never_judged_stalled() -> None:
    assert decode_stalled(series(20, running=4), WEDGE_AFTER) is None


def test_finished_requests_are_progress_but_their_absence_proves_nothing() -> None:
    h = series(13, running=4, throughput=0.0, completed=[7] * 12 + [8])
    assert decode_stalled(h, WEDGE_AFTER) is None
    assert decode_stalled(series(13, running=4, completed=7), WEDGE_AFTER) is None


def test_kv_arriving_is_progress_only_for_requests_not_yet_running() -> None:
    """A stalled pdworker decode still lands KV for new requests it never runs."""
    arriving = [10 + i for i in range(13)]
    queued = series(13, transfer_queue=2, generated_tokens=500, kv_transfers=arriving)
    assert decode_stalled(queued, WEDGE_AFTER) is None
    running = series(13, running=2, generated_tokens=500, kv_transfers=arriving)
    assert decode_stalled(running, WEDGE_AFTER) is not None


def test_pdworker_healthy_long_decode_for_ten_minutes() -> None:
    h = series(121, incarnation="d0-a", running=4, generated_tokens=[4000 * i for i in range(121)],
               completed=12)  # fmt: skip
    d = detect([prefill([]), decode(history=h)], WEDGE_AFTER)
    assert d.findings == () and d.healthy_decodes == {"d-0"}


def test_pdworker_saturated_prefill_whose_inflight_gauge_never_reaches_zero() -> None:
    """Rooms pass through the inflight queue in seconds; the gauge is never 0 for 10 minutes."""
    h = series(121, inflight_queue=[2 + i % 4 for i in range(121)],
               kv_transfers=[30 * i for i in range(121)])  # fmt: skip
    rooms = [room(i, "inflight", 0.5 + i) for i in range(5)] + [room(9, "forward", 30)]
    assert detect([prefill(rooms, history=h), *decodes()], WEDGE_AFTER).findings == ()


def test_progress_before_the_window_does_not_hide_a_stall() -> None:
    tokens = [100, 200, 300] + [400] * 14
    h = series(17, transfer_queue=1, generated_tokens=tokens)
    assert decode_stalled(h, WEDGE_AFTER) is not None


def test_token_counter_reset_is_not_a_stall() -> None:
    """The decode process restarted inside the same pod and is generating again from zero."""
    tokens = [90_000] * 3 + [40 * i for i in range(10)]
    h = series(13, running=3, generated_tokens=tokens)
    assert decode_stalled(h, WEDGE_AFTER) is None


# -- unknown pods --------------------------------------------------------------------------


def test_stale_pods_are_unknown_and_never_judged() -> None:
    wedged = [room(1, "inflight", 500)]
    stale_prefill = PodView(
        "p-0", "prefill", "u", series(3, inflight_queue=1), tuple(wedged), stale=True,
        error="TimeoutError",
    )  # fmt: skip
    stalled = series(13, transfer_queue=2, generated_tokens=5)
    stale_decode = PodView("d-0", "decode", "u2", stalled, stale=True)
    never = PodView("d-1", "decode", "u3")
    d = detect([stale_prefill, stale_decode, never], WEDGE_AFTER)
    assert d == Detection(
        findings=(),
        unknown=("d-0: no fresh metrics", "d-1: no fresh metrics", "p-0: TimeoutError"),
        stalled_decodes=frozenset(),
    )


def test_one_stale_pod_does_not_hide_the_others() -> None:
    stale = PodView("p-1", "prefill", "u", (), stale=True, error="HTTP 500")
    d = detect([prefill([room(1, "inflight", 70)]), stale, *decodes()], WEDGE_AFTER)
    assert [f.pod for f in d.findings] == ["p-0"]
    assert d.unknown == ("p-1: HTTP 500",)


def test_nothing_to_judge() -> None:
    assert detect([], WEDGE_AFTER) == Detection()


def test_only_a_full_window_without_a_stall_counts_as_healthy() -> None:
    idle = decode("d-0", history=series(20, running=0, generated_tokens=500))
    busy = decode("d-1", history=series(20, running=2, generated_tokens=list(range(20))))
    young = decode("d-2", history=series(3, running=0, generated_tokens=500))
    stuck = decode("d-3", history=series(20, transfer_queue=2, generated_tokens=500))
    d = detect([idle, busy, young, stuck], WEDGE_AFTER)
    assert d.healthy_decodes == frozenset({"d-0", "d-1"})
    assert d.stalled_decodes == frozenset({"d-3"})


def test_a_decode_waiting_for_a_long_prefill_is_not_stalled() -> None:
    """Requests queued on decode while their prefill still computes: legal, however long."""
    waiting = decode("d-0", history=series(20, transfer_queue=1, generated_tokens=500))
    computing = prefill([room(1, "forward", 90, peer="d-0")])
    assert detect([computing, waiting], WEDGE_AFTER).stalled_decodes == frozenset()
    # Once no prefill computes for it, the same queue with no progress is a stall.
    done = prefill([room(2, "forward", 90, peer="d-1")])
    assert detect([done, waiting], WEDGE_AFTER).stalled_decodes == frozenset({"d-0"})


def test_a_decode_waiting_for_kv_on_the_way_is_not_stalled() -> None:
    """The long prefill is done and its room's KV is being sent: the decode still waits
    legitimately (bench/recovery found one false cordon at that moment under load)."""
    waiting = decode("d-0", history=series(20, transfer_queue=1, generated_tokens=500))
    sending = prefill([room(1, "inflight", 1.5, peer="d-0")])
    assert detect([sending, waiting], WEDGE_AFTER).stalled_decodes == frozenset()
    # A room inflight for longer than the window is wedged on the prefill side instead.
    stuck = prefill([room(1, "inflight", 61, peer="d-0")])
    d = detect([stuck, waiting], WEDGE_AFTER)
    assert [f.reason for f in d.findings] == ["InflightStuck", "DecodeStalled"]


def test_a_decode_whose_prefill_finished_between_two_reads_is_not_stalled() -> None:
    """The prefill's room succeeded after the decode's sample was read but before the
    prefill's rooms were: the latest list no longer has it while the decode still queues the
    request with nothing moved (bench/recovery: the long prefill's last cycle). A prefill that
    worked for the decode at an earlier scrape of the window is enough."""
    waiting = decode("d-0", history=series(20, transfer_queue=1, generated_tokens=500))
    last = waiting.history[-1].at
    hist = series(20, inflight_queue=0)
    earlier = ((last - STEP, (room(1, "forward", 88, peer="d-0"),)),)
    finished = PodView("p-0", "prefill", "uid-p-0", hist, (), recent_rooms=earlier)
    assert detect([finished, waiting], WEDGE_AFTER).stalled_decodes == frozenset()
    # Work seen before the window does not excuse a whole window of nothing.
    long_ago = ((last - WEDGE_AFTER - STEP, (room(1, "forward", 88, peer="d-0"),)),)
    old = PodView("p-0", "prefill", "uid-p-0", hist, (), recent_rooms=long_ago)
    assert detect([old, waiting], WEDGE_AFTER).stalled_decodes == frozenset({"d-0"})
    # Nor does a room that was already wedged in the inflight queue at that earlier scrape.
    wedged = ((last - STEP, (room(1, "inflight", 61, peer="d-0"),)),)
    stuck = PodView("p-0", "prefill", "uid-p-0", hist, (), recent_rooms=wedged)
    assert detect([stuck, waiting], WEDGE_AFTER).stalled_decodes == frozenset({"d-0"})


def test_working_rooms_keep_one_room_per_peer_and_are_bounded() -> None:
    rooms = [
        room(1, "inflight", 30, peer="d-0"),
        room(2, "inflight", 5, peer="d-0"),  # younger: kept over room 1
        room(3, "bootstrap", 1),  # no peer yet, not working for anyone
        room(4, "inflight", 9, peer="d-1"),
        room(5, "forward", 70, peer="d-1"),  # computing beats any inflight room
        room(6, "inflight", 2, peer="d-1"),
    ]
    kept = {r.peer_pod: (r.room, r.phase) for r in working_rooms(rooms)}
    assert kept == {"d-0": (2, "inflight"), "d-1": (5, "forward")}
    many = [room(i, "forward", 1, peer=f"d-{i}") for i in range(MAX_WORKING_PEERS + 50)]
    assert len(working_rooms(many)) == MAX_WORKING_PEERS


def test_without_rooms_from_every_prefill_only_stuck_running_requests_are_a_stall() -> None:
    queued = decode("d-0", history=series(20, transfer_queue=3, generated_tokens=500))
    running = decode("d-1", history=series(20, running=2, generated_tokens=500))
    gauge_only = prefill(None)
    d = detect([gauge_only, queued, running], WEDGE_AFTER)
    assert d.stalled_decodes == frozenset({"d-1"})
