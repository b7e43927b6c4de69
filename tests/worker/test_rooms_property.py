"""Property tests of the room state machine: arbitrary interleavings of transfer, abort, timeout,
clear and late-write events always end with terminal rooms and a pool that does not leak."""

from __future__ import annotations

from itertools import pairwise

from hypothesis import find, given, settings
from hypothesis import strategies as st

from pdworker.contract import FAILURE_REASONS, KVPoll
from pdworker.pages import PagePool
from pdworker.rooms import TERMINAL, RoomRejected, RoomTable

DEADLINES = {"bootstrap": 5.0, "inflight": 5.0, "prealloc": 5.0, "transfer": 5.0}
ROOMS = st.integers(min_value=0, max_value=5)
EVENTS = st.one_of(
    st.tuples(st.just("create"), ROOMS),
    st.tuples(st.just("handshake"), ROOMS),
    st.tuples(st.just("chunk"), ROOMS),  # a chunk write: Transferring
    st.tuples(st.just("done"), ROOMS),  # the last chunk landed: Success
    st.tuples(st.just("abort"), ROOMS),
    st.tuples(st.just("fail"), ROOMS, st.sampled_from(FAILURE_REASONS)),
    st.tuples(st.just("tick"), st.floats(min_value=0, max_value=4)),
    st.tuples(st.just("clear"), ROOMS),
    st.tuples(st.just("inflight"), ROOMS),
)


class Harness:
    """Drives a RoomTable and a PagePool the way the workers do."""

    def __init__(self, legacy: bool = False) -> None:
        self.table = RoomTable("prefill", deadlines=DEADLINES, legacy=legacy)
        self.pool = PagePool(64)
        self.now = 0.0
        self.cleared: set[int] = set()
        self.history: dict[int, list[KVPoll]] = {}

    def apply(self, event: tuple) -> None:
        kind, *args = event
        t, now = self.table, self.now
        if kind == "tick":
            self.now += args[0]
            t.expire(self.now)
            return
        room = args[0]
        if kind == "create":
            try:
                t.create(room, "bootstrap", now)
            except RoomRejected:
                return
            self.cleared.discard(room)
            self.history[room] = []  # an explicit create starts a new lifetime of this id
            self.pool.alloc(room, 2)
        elif kind == "handshake":
            t.update(room, KVPoll.WaitingForInput, now)
        elif kind == "chunk":
            t.update(room, KVPoll.Transferring, now)
        elif kind == "done":
            t.update(room, KVPoll.Success, now)
        elif kind == "abort":
            t.fail(room, "aborted", now)
        elif kind == "fail":
            t.fail(room, args[1], now)
        elif kind == "inflight":
            t.set_phase(room, "inflight", now)
        elif kind == "clear":
            entry = t.get(room)
            if entry is not None and entry.terminal:
                t.clear(room)
                self.pool.free(room)
                self.cleared.add(room)
        entry = t.get(room)
        if entry is not None:
            self.history.setdefault(room, []).append(entry.status)

    def settle(self) -> None:
        """What the workers' loops do forever: let every deadline pass, clear terminal rooms."""
        self.now += 100
        self.table.expire(self.now)
        for entry in self.table.snapshot():
            if entry.terminal:
                self.table.clear(entry.room)
                self.pool.free(entry.room)


@settings(max_examples=400, deadline=None)
@given(st.lists(EVENTS, max_size=60))
def test_rooms_end_terminal_and_pages_never_leak(events: list[tuple]) -> None:
    h = Harness()
    for event in events:
        h.apply(event)
        for entry in h.table.snapshot():
            assert entry.room not in h.cleared, "a cleared room was re-created by a late write"
            if entry.status == KVPoll.Failed:
                assert entry.reason in FAILURE_REASONS
    for room, statuses in h.history.items():
        for before, after in pairwise(statuses):
            if before in TERMINAL:
                assert after == before, f"room {room}: terminal {before!r} became {after!r}"
            elif after != KVPoll.Failed:
                assert after >= before, f"room {room}: status moved backwards"
    h.settle()
    # Rooms in waiting phases have deadlines, so after settling nothing non-terminal waits.
    assert all(e.phase not in DEADLINES for e in h.table.snapshot())
    live = {e.room for e in h.table.snapshot()}
    assert h.pool.owners == len(live)  # only rooms still computing hold pages
    if not live:
        assert h.pool.free_count == h.pool.total


@settings(max_examples=200, deadline=None)
@given(st.lists(EVENTS, max_size=60))
def test_every_room_ends_terminal_or_cleared(events: list[tuple]) -> None:
    h = Harness()
    for event in events:
        h.apply(event)
    h.settle()
    assert len(h.table) == 0
    assert h.pool.free_count == h.pool.total


def test_legacy_mode_resurrects_a_failed_room() -> None:
    """The production wedge: abort, then a late Transferring write, and Failed is gone."""
    legacy = RoomTable("prefill", legacy=True)
    legacy.create(1, "inflight", 0.0)
    legacy.update(1, KVPoll.Transferring, 0.0)
    assert legacy.fail(1, "aborted", 0.0)
    legacy.update(1, KVPoll.Transferring, 0.1)
    assert legacy.status(1) == KVPoll.Transferring
    legacy.clear(1)
    legacy.update(1, KVPoll.Transferring, 0.2)  # a late write re-creates a cleared room
    assert legacy.status(1) == KVPoll.Transferring

    fixed = RoomTable("prefill")
    fixed.create(1, "inflight", 0.0)
    assert fixed.fail(1, "aborted", 0.0)
    assert fixed.update(1, KVPoll.Transferring, 0.1) == KVPoll.Failed
    fixed.clear(1)
    assert fixed.update(1, KVPoll.Transferring, 0.2) is None
    assert fixed.get(1) is None


def test_inflight_watchdog_counts_from_entering_the_queue() -> None:
    t = RoomTable("prefill", deadlines={"inflight": 5.0})
    t.create(7, "forward", 0.0)  # a long prefill is legal: no deadline while computing
    assert t.expire(100.0) == []
    t.set_phase(7, "inflight", 100.0)
    assert t.expire(104.0) == []
    [failed] = t.expire(105.5)
    assert failed.reason == "inflight_timeout"
    assert "5s" in failed.detail


def test_failure_needs_a_known_reason_and_first_reason_wins() -> None:
    t = RoomTable("decode")
    t.create(3, "transfer", 0.0)
    try:
        t.fail(3, "because", 0.0)
    except ValueError:
        pass
    else:
        raise AssertionError("unknown reason accepted")
    try:
        t.update(3, KVPoll.Failed, 0.0)
    except ValueError:
        pass
    else:
        raise AssertionError("a reasonless failure was accepted")
    assert t.fail(3, "peer_lost", 0.0)
    assert not t.fail(3, "admin", 0.0)
    assert t.get(3).reason == "peer_lost"


def test_early_abort_tombstone_rejects_the_late_request() -> None:
    t = RoomTable("prefill")
    t.tombstone(9, "aborted", "aborted by decode before prefill saw it")
    try:
        t.create(9, "bootstrap", 0.0)
    except RoomRejected as exc:
        assert exc.reason == "aborted"
    else:
        raise AssertionError("tombstoned room was created")
    t.create(9, "bootstrap", 1.0)  # the tombstone is consumed once


def test_page_pool_alloc_free() -> None:
    pool = PagePool(4)
    a = pool.alloc(1, 3)
    assert a is not None and len(set(a)) == 3
    assert pool.alloc(2, 2) is None  # nothing taken on failure
    assert pool.free_count == 1
    assert pool.free(1) == 3
    assert pool.free(1) == 0  # idempotent
    assert pool.free_count == 4


def test_page_pool_hands_out_ascending_runs_again_after_free() -> None:
    """NIXL merges consecutive pages into one descriptor only in ascending order on both
    sides; a freed room's pages must come back in that order, not reversed."""
    pool = PagePool(64)
    assert pool.alloc(1, 8) == list(range(8))
    assert pool.alloc(2, 8) == list(range(8, 16))
    pool.free(1)
    assert pool.alloc(3, 8) == list(range(8))
    pool.free(2)
    pool.free(3)
    assert pool.alloc(4, 16) == list(range(16))


def _legacy_wedges(events: list[tuple]) -> bool:
    h = Harness(legacy=True)
    for event in events:
        h.apply(event)
    h.table.deadlines.pop("inflight")  # no-inflight-watchdog
    h.settle()
    return any(not e.terminal for e in h.table.snapshot())


def test_the_property_catches_the_legacy_race() -> None:
    """The same event model finds the wedge when the legacy fault is on: the test can fail."""
    example = find(
        st.lists(EVENTS, max_size=30), _legacy_wedges, settings=settings(max_examples=5000)
    )
    assert _legacy_wedges(example)
    fixed = Harness()
    for event in example:
        fixed.apply(event)
    fixed.settle()
    assert len(fixed.table) == 0, "the fixed machine must not wedge on the same events"
