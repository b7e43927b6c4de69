"""remediation.memory: which pods are scraped, which are stale, a decode pod's serving state."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from pdwarden.constants import CONDITION_SERVING, LABEL_ROLE
from pdwarden.remediation.detect.evidence import Finding, PodView
from pdwarden.remediation.detect.rules import Detection, detect
from pdwarden.remediation.memory import (
    DeploymentMemory,
    Observation,
    WorkerPod,
    decode_pod,
    new_findings,
    observation,
    pod_views,
    remember,
    scrape_targets,
    stale_pods,
)
from pdwarden.values import RoomView, Sample

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def pod(
    name: str, role: str, *, ip: str | None = "10.0.0.1", phase: str = "Running",
    deleting: bool = False, conditions: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:  # fmt: skip
    meta: dict[str, Any] = {"name": name, "uid": f"uid-{name}",
                            "labels": {LABEL_ROLE: role}}  # fmt: skip
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    status: dict[str, Any] = {"phase": phase, "conditions": conditions or []}
    if ip:
        status["podIP"] = ip
    return {"metadata": meta, "status": status}


def test_only_running_worker_pods_with_an_ip_are_scraped_and_only_pdworker_prefill_rooms() -> None:
    pods = [
        pod("p-0", "prefill"), pod("d-0", "decode"), pod("r-0", "router"),
        pod("p-1", "prefill", ip=None), pod("p-2", "prefill", phase="Pending"),
        pod("d-1", "decode", deleting=True),
    ]  # fmt: skip
    assert [(t.name, t.rooms) for t in scrape_targets(pods, "pdworker")] == [
        ("p-0", True), ("d-0", False),
    ]  # fmt: skip
    assert [t.rooms for t in scrape_targets(pods, "sglang")] == [False, False]


def test_a_pod_is_stale_after_an_error_or_two_and_a_half_silent_intervals() -> None:
    mem = DeploymentMemory()
    targets = [
        WorkerPod("p-0", "u0", "prefill", "ip", True),
        WorkerPod("d-0", "u1", "decode", "ip", False),
    ]
    remember(mem, [Observation("u0", sample=Sample(at=100.0)), Observation("u1", error="boom")], 60)
    obs = {"u0": Observation("u0", sample=Sample(at=100.0)), "u1": Observation("u1", error="x")}
    fresh = pod_views(targets, obs, mem, mono=102.0, interval=1.0)
    assert [(v.name, v.stale, v.error) for v in fresh] == [
        ("p-0", False, None),
        ("d-0", True, "boom"),
    ]
    later = pod_views(targets, obs, mem, mono=102.6, interval=1.0)
    assert later[0].stale  # 2.6 intervals since the last good sample
    # Pods that exist but were not scraped (no IP yet) cannot be judged either.
    assert stale_pods([pod("d-9", "decode", ip=None)], fresh) == {"d-0", "d-9"}


def test_history_keeps_only_the_window_and_forgets_pods_gone() -> None:
    mem = DeploymentMemory()
    for at in (0.0, 5.0, 10.0, 20.0):
        remember(mem, [Observation("u0", sample=Sample(at=at))], keep_seconds=10.0)
    assert [s.at for s in mem.pods["u0"].samples] == [10.0, 20.0]
    remember(mem, [Observation("u1", sample=Sample(at=21.0))], keep_seconds=10.0)
    assert set(mem.pods) == {"u1"}


def test_observation_cleans_hostile_rooms() -> None:
    o = observation("u", Sample(at=1.0), [RoomView(1, "inflight", -3.0, "A" * 300, "i")], None)
    assert o.rooms is not None
    [room] = o.rooms
    assert room.phase_seconds == 0.0 and room.peer_pod is None and room.peer_incarnation is None
    assert observation("u", None, None, "x" * 10_000).error is not None
    assert len(observation("u", None, None, "x" * 10_000).error or "") <= 512


def test_decode_pod_serving_state() -> None:
    since = (NOW - timedelta(seconds=30)).isoformat().replace("+00:00", "Z")
    cordoned = pod("d-0", "decode", conditions=[
        {"type": CONDITION_SERVING, "status": "False", "lastTransitionTime": since},
        {"type": "Ready", "status": "False"},
    ])  # fmt: skip
    d = decode_pod(cordoned, stale=False, now=NOW)
    assert d.cordoned_since == NOW - timedelta(seconds=30) and not d.ready
    garbled = pod("d-1", "decode", conditions=[
        {"type": CONDITION_SERVING, "status": "False", "lastTransitionTime": "yesterday"}
    ])  # fmt: skip
    assert decode_pod(garbled, stale=False, now=NOW).cordoned_since == NOW  # safe reading
    ready = pod("d-2", "decode", conditions=[{"type": "Ready", "status": "True"}])
    assert decode_pod(ready, stale=True, now=NOW).ready


def test_a_finding_is_announced_once_until_it_clears() -> None:
    seen: dict[tuple[str, str, str], datetime] = {}
    f = Finding(pod="p-0", role="prefill", reason="InflightStuck", peer="d-1")
    assert new_findings(seen, Detection(findings=(f,)), NOW) == [f]
    assert new_findings(seen, Detection(findings=(f,)), NOW) == []
    assert new_findings(seen, Detection(), NOW) == []
    assert new_findings(seen, Detection(findings=(f,)), NOW) == [f]


def _flat(name: str, role: str, n: int = 15, **fields: float) -> PodView:
    return PodView(name, role, name + "-uid",
                   history=tuple(Sample(at=float(i), **fields) for i in range(n)))  # fmt: skip


def test_a_stuck_read_is_announced_once_while_its_suspects_change() -> None:
    """Measured on the real vLLM pair: one stuck read drew three WedgeDetected Events in 12 s
    as the prefill it named was restarted (the one suspect, then old and new pod, then the new
    one). One wedge: the decode's stuck read; one announcement."""
    stuck = _flat("decode-0", "decode", reading_queue=1.0, kv_transfers=10.0, failed=0.0)
    old, new = _flat("prefill-0", "prefill", prefill_tokens=5.0), _flat(
        "prefill-1", "prefill", n=1, prefill_tokens=0.0)  # fmt: skip
    seen: dict[tuple[str, str, str], datetime] = {}
    announced = []
    for pods in ([stuck, old], [stuck, old, new], [stuck, new]):
        (f,) = detect(pods, 10.0).findings
        assert f.reason == "KVReadStuck"
        announced += new_findings(seen, Detection(findings=(f,)), NOW)
    assert [(f.pod, f.suspects) for f in announced] == [("decode-0", ("prefill-0",))]


def test_rooms_stuck_with_two_named_decodes_are_two_wedges() -> None:
    """Where a metric names the peer (a prefill's rooms), the peer is part of the wedge."""
    seen: dict[tuple[str, str, str], datetime] = {}
    one, two = (Finding(pod="p-0", role="prefill", reason="InflightStuck", peer=d)
                for d in ("d-1", "d-2"))  # fmt: skip
    assert new_findings(seen, Detection(findings=(one,)), NOW) == [one]
    assert new_findings(seen, Detection(findings=(one, two)), NOW) == [two]


def _room(n: int, claimed: str | None, ip: str | None) -> RoomView:
    return RoomView(n, "inflight", 90.0, claimed, "inc-1", ip)


def test_a_rooms_peer_is_named_by_the_verified_address_never_by_its_own_word() -> None:
    targets = [
        WorkerPod("pd-prefill-0", "u-p0", "prefill", "127.0.1.1", rooms=True),
        WorkerPod("pd-decode-0", "u-d0", "decode", "127.0.2.1", rooms=False),
        WorkerPod("pd-decode-1", "u-d1", "decode", "127.0.2.2", rooms=False),
    ]
    rooms = [
        _room(1, "pd-decode-1", "127.0.2.1"),  # claims decode-1, verified as decode-0
        _room(2, "pd-decode-0", "127.0.9.9"),  # no current decode pod has this address
        _room(3, "pd-decode-1", None),  # no verified address: no peer at all
    ]
    obs = {t.uid: observation(t.uid, Sample(at=1.0), rooms if t.rooms else None, None)
           for t in targets}  # fmt: skip
    mem = DeploymentMemory()
    remember(mem, list(obs.values()), keep_seconds=60.0)
    (prefill, *_) = pod_views(targets, obs, mem, mono=1.0, interval=5.0)
    assert prefill.rooms is not None
    peers = {r.room: (r.peer_pod, r.peer_incarnation) for r in prefill.rooms}
    assert peers == {1: ("pd-decode-0", "inc-1"), 2: ("127.0.9.9", "inc-1"), 3: (None, None)}


def test_working_rooms_of_earlier_scrapes_are_kept_for_the_window_and_named_by_address() -> None:
    targets = [
        WorkerPod("pd-prefill-0", "u-p0", "prefill", "127.0.1.1", rooms=True),
        WorkerPod("pd-decode-0", "u-d0", "decode", "127.0.2.1", rooms=False),
    ]
    mem = DeploymentMemory()
    lists = {1.0: [RoomView(7, "forward", 3.0, "pd-decode-9", "inc-1", "127.0.2.1")],
             6.0: [], 11.0: [RoomView(8, "done", 0.0, None, None, None)]}  # fmt: skip
    for at, rooms in lists.items():
        obs = {t.uid: observation(t.uid, Sample(at=at), rooms if t.rooms else None, None)
               for t in targets}  # fmt: skip
        remember(mem, list(obs.values()), keep_seconds=10.0)
    (prefill, decode) = pod_views(targets, obs, mem, mono=11.0, interval=5.0)
    assert [at for at, _ in prefill.recent_rooms] == [1.0, 6.0, 11.0]
    assert [(r.room, r.peer_pod) for r in prefill.recent_rooms[0][1]] == [(7, "pd-decode-0")]
    assert prefill.recent_rooms[2][1] == ()  # a room in no working phase is not kept
    assert decode.recent_rooms == ()
    remember(mem, [observation("u-p0", Sample(at=12.0), [], None)], keep_seconds=10.0)
    assert [at for at, _ in mem.pods["u-p0"].rooms] == [6.0, 11.0, 12.0]


def test_a_stuck_queue_is_timed_from_when_it_was_last_seen_empty_past_the_history_kept() -> None:
    """Memory keeps 75 s of samples, yet remembers when a prefill's inflight queue was last seen
    empty: a gauge-read wedge says how long the queue has held rooms (so the ladder can tell a
    queue its abort never emptied from new rooms after one that did)."""
    mem = DeploymentMemory()
    target = WorkerPod("p-0", "uid-p-0", "prefill", "10.0.0.1", rooms=False, engine="sglang")
    decode = WorkerPod("d-0", "uid-d-0", "decode", "10.0.0.2", rooms=False, engine="sglang")

    def scrape(at: float, inflight: float) -> list[PodView]:
        obs = [
            observation("uid-p-0", Sample(at=at, inflight_queue=inflight, kv_transfers=5.0,
                                          completed=5.0, failed=0.0), None, None),
            observation("uid-d-0", Sample(at=at, generated_tokens=9.0), None, None),
        ]  # fmt: skip
        remember(mem, obs, keep_seconds=75.0)
        return pod_views([target, decode], {o.uid: o for o in obs}, mem, at, 5.0)

    scrape(1000.0, 0.0)
    for at in range(1005, 1205, 5):  # rooms from 1005 s on, none leaving: 200 s
        views = scrape(float(at), 2.0)
    prefill = views[0]
    assert prefill.inflight_empty_at == 1000.0 and prefill.history[0].at >= 1200.0 - 75
    (f,) = [f for f in detect(views, 60.0).findings if f.reason == "InflightGaugeStuck"]
    assert f.oldest_seconds == 200.0  # not the 75 s of history kept
    # Seen empty again: the count starts over (the first one seen starts it too).
    scrape(1205.0, 0.0)
    views = scrape(1210.0, 1.0)
    assert views[0].inflight_empty_at == 1205.0
