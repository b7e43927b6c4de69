"""The KV data path in-process: ordering after compute, one WRITE per chunk, cheap exact integrity.

No worker processes here (tests/worker/test_integrity.py has those): these tests drive
PrefillWorker's compute/transfer path with an in-memory transport (memtransport.py) and a fake
device event, so the order "kernels done -> WRITE posted" is observable on CPU.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import pytest
import torch
from memtransport import Hub, MemoryTransport

from pdworker import integrity
from pdworker.config import ModelConfig, WorkerConfig
from pdworker.model import KVPool, TinyModel, pick_device
from pdworker.nixl_loader import preferred_order
from pdworker.ordering import PASSED, Ordering
from pdworker.prefill import Binding, DecodePeer, PrefillWorker, RoomWork
from pdworker.rooms import Peer

CFG = ModelConfig(layers=2, heads=2, head_dim=8, page_size=4, vocab=64)


class FakeEvent:
    def __init__(self, log: list[str]) -> None:
        self.log = log
        self.done = False

    def record(self) -> None:
        self.log.append("record")

    def synchronize(self) -> None:
        self.log.append("wait")
        self.done = True

    def query(self) -> bool:
        return self.done


def test_ordering_is_a_no_op_on_cpu_and_records_then_waits_with_events() -> None:
    assert Ordering(torch.device("cpu")).fence() is PASSED
    log: list[str] = []
    ordering = Ordering(torch.device("cpu"), event_factory=lambda: FakeEvent(log))
    fence = ordering.fence()
    assert log == ["record"] and not fence.passed()
    fence.wait()
    assert log == ["record", "wait"] and fence.passed()


def test_nixl_build_order_follows_torch_cuda() -> None:
    assert preferred_order("13.0") == ["nixl_cu13", "nixl_cu12"]
    assert preferred_order("12.8") == ["nixl_cu12", "nixl_cu13"]
    assert preferred_order(None) == ["nixl_cu13", "nixl_cu12"]
    assert preferred_order("13.0", override="nixl_cu12") == ["nixl_cu12"]


def _pool_with_kv(pages: int = 6) -> KVPool:
    pool = KVPool(CFG, pages, torch.device("cpu"))
    gen = torch.Generator().manual_seed(3)
    pool.tensor.copy_(torch.randn(pool.tensor.shape, generator=gen))
    return pool


def test_fingerprint_catches_every_single_flipped_bit_and_swapped_pages() -> None:
    pool = _pool_with_kv()
    pages = [4, 1, 2]
    picks = [0, 1, 2]
    base = integrity.fingerprint(pool.tensor, pages, picks)
    raw = pool.tensor.view(pool.num_pages, -1).view(torch.uint8)
    for page in pages:
        for at in range(0, raw.shape[1], 7):  # every 7th byte of each page, every bit
            for bit in range(8):
                raw[page, at] ^= 1 << bit
                assert integrity.fingerprint(pool.tensor, pages, picks) != base
                raw[page, at] ^= 1 << bit
    assert integrity.fingerprint(pool.tensor, pages, picks) == base
    assert integrity.fingerprint(pool.tensor, [1, 4, 2], picks) != base  # pages in wrong places
    # Runs and single pages give the same value as one gathered copy would.
    copy = KVPool(CFG, 3, torch.device("cpu"))
    copy.tensor.copy_(pool.tensor[torch.tensor(pages)])
    assert integrity.fingerprint(copy.tensor, [0, 1, 2], picks) == base


def test_sample_plan_covers_small_rooms_fully_and_is_shared_through_the_string() -> None:
    assert integrity.plan("sample", 1).mode == "full"
    spec = integrity.plan("sample", 100, random.Random(1))
    assert spec.mode == "sample" and spec.count == 4
    picks = integrity.positions(spec, 100)
    assert len(picks) == 4 and picks[-1] == 99 and picks == integrity.positions(spec, 100)
    pool = _pool_with_kv(8)
    pages = [7, 0, 3, 5]
    text = integrity.checksum(pool.tensor, pages, integrity.plan("full", 4))
    assert text.startswith("full.4.0.") and ":" not in text
    assert integrity.decode_spec(text) == integrity.Spec("full", 4, 0)
    assert integrity.checksum(pool.tensor, pages, integrity.decode_spec(text)) == text
    assert integrity.decode_spec("off") is None and integrity.decode_spec("x.1.2.zz") is None
    with pytest.raises(ValueError, match="kv-verify"):
        integrity.plan("most", 3)


def _prefill(hub: Hub, log: list[str], chunk_pages: int) -> tuple[PrefillWorker, KVPool]:
    cfg = WorkerConfig(role="prefill", model=CFG, device="cpu", kv_pages=64,
                       chunk_pages=chunk_pages, kv_verify="full")  # fmt: skip
    device = pick_device("cpu")
    pool = KVPool(CFG, cfg.kv_pages, device)
    transport = MemoryTransport(hub, "prefill", pool.tensor)
    worker = PrefillWorker(cfg, TinyModel(CFG, device), pool, transport)

    def event() -> FakeEvent:
        ev = FakeEvent(log)
        ev.record = lambda: log.append("record")  # type: ignore[method-assign]
        return ev

    worker.ordering = Ordering(device, event_factory=event)
    real_submit = transport.submit

    def submit(*args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        log.append("submit")
        real_submit(*args, **kwargs)

    transport.submit = submit  # type: ignore[method-assign]
    return worker, pool


async def _start_room(
    worker: PrefillWorker, room: int, ids: list[int], dest: list[int]
) -> asyncio.Future[dict[str, Any]]:
    """Start the worker, give it a decode peer and bind one room to `dest` (its forward starts)."""
    await worker.start()
    worker.transport.add_peer("decode", b"decode", [], "DRAM")
    worker.peers["decode"] = DecodePeer("decode", Peer("d", "d:1", "d-1"), 64, time.monotonic())
    worker.table.create(room, "bootstrap", time.monotonic())
    worker.work[room] = RoomWork(ids=ids)
    result: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
    worker.waiters[room] = result
    assert worker.admission.bind(room, Binding("decode", dest, time.monotonic())) is None
    return result


def test_prefill_posts_each_chunk_once_after_its_fence_and_decode_gets_exact_kv() -> None:
    hub, log = Hub(), []
    worker, pool = _prefill(hub, log, chunk_pages=2)
    decode_pool = KVPool(CFG, 64, torch.device("cpu"))
    decode = MemoryTransport(hub, "decode", decode_pool.tensor)
    ids = list(range(1, 31))  # 30 tokens: 8 pages, 4 chunks of 2 pages
    room, dest = 77, [60, 61, 62, 10, 11, 12, 13, 40]

    async def main() -> None:
        result = await _start_room(worker, room, ids, dest)
        answer = await asyncio.wait_for(result, 30)
        assert answer["ok"] and answer["kv_bytes"] == 8 * CFG.page_bytes, answer
        await worker.stop()

    asyncio.run(main())
    # Every WRITE came right after a fence was waited on; one WRITE per chunk.
    assert log.count("submit") == 4
    for i, entry in enumerate(log):
        if entry == "submit":
            assert log[i - 1] == "wait", log
    # The bytes decode holds are prefill's, and the meta carries a checksum decode can recompute.
    local = [p for p in range(64) if (pool.tensor[p] != 0).any()]
    assert len(local) == 8
    notes = decode.poll_notifs()["prefill"]
    assert sorted(n.decode() for n in notes if n.startswith(b"kv:")) == [
        f"kv:{room}:{i}" for i in range(4)
    ]
    meta = [n.decode() for n in notes if n.startswith(b"meta:")]
    assert len(meta) == 1 and notes[-1].startswith(b"meta:")  # meta after every chunk landed
    checksum = meta[0].split(":")[4]
    spec = integrity.decode_spec(checksum)
    assert spec is not None and spec.mode == "full"
    assert integrity.checksum(decode_pool.tensor, dest, spec) == checksum
    reference = KVPool(CFG, 8, torch.device("cpu"))
    model = TinyModel(CFG, torch.device("cpu"))
    for c in range(4):
        kv, _ = model.prefill_chunk(ids[c * 8 : (c + 1) * 8])
        reference.write_tokens(list(range(c * 2, c * 2 + 2)), kv)
    assert torch.equal(decode_pool.tensor[torch.tensor(dest)], reference.tensor)


class _Disconnected(Exception):
    pass


class FakeAgent:
    """NIXL's agent API as NixlTransport uses it; WRITE states are scripted per notification."""

    def __init__(self) -> None:
        self.states: dict[bytes, list[str]] = {}
        self.refuse_release = 0
        self.released: list[bytes] = []
        self.posted: list[tuple[list[int], list[int]]] = []
        self.inbox: list[bytes] = []
        self.drains = 0
        self.drain_threads: set[str] = set()

    def make_prepped_xfer(self, *args):  # type: ignore[no-untyped-def]
        _op, _local, lidx, _remote, ridx, notif = args
        self.posted.append((list(lidx), list(ridx)))
        return notif

    def transfer(self, handle: bytes) -> str:
        return self.states[handle].pop(0)

    def check_xfer_state(self, handle: bytes) -> str:
        script = self.states[handle]
        return script.pop(0) if len(script) > 1 else script[0]

    def get_new_notifs(self) -> dict[str, list[bytes]]:
        """One queued notification per call, from peer "peer"; records who drains."""
        import threading

        self.drains += 1
        self.drain_threads.add(threading.current_thread().name)
        return {"peer": [self.inbox.pop(0)]} if self.inbox else {}

    def release_xfer_handle(self, handle: bytes) -> None:
        if self.refuse_release:
            self.refuse_release -= 1
            raise RuntimeError("cannot cancel")
        self.released.append(handle)


def _fake_transport() -> tuple[Any, FakeAgent]:
    from types import SimpleNamespace

    from pdworker.transfer import NixlTransport

    transport = NixlTransport.__new__(NixlTransport)
    transport._bindings = SimpleNamespace(nixlRemoteDisconnectError=_Disconnected)
    transport.name = "fake"
    agent = FakeAgent()
    transport._start(agent, "local")
    transport._remote["peer"] = "remote"
    return transport, agent


def test_every_handle_is_released_once_with_its_outcome_and_deadline() -> None:
    import threading

    from pdworker.transfer import TransferError

    transport, agent = _fake_transport()
    outcomes: dict[bytes, TransferError | None] = {}
    finished = threading.Event()

    def done_for(notif: bytes):  # type: ignore[no-untyped-def]
        def done(err: TransferError | None) -> None:
            assert notif not in outcomes, "done called twice"
            outcomes[notif] = err
            if len(outcomes) == 4:
                finished.set()

        return done

    agent.states = {
        b"now": ["DONE"],  # done inside transfer()
        b"later": ["PROC", "PROC", "PROC", "DONE"],  # completed by the progress thread
        b"stuck": ["PROC", "PROC"],  # never completes: the deadline cancels it
        b"err": ["PROC", "ERR"],
    }
    agent.refuse_release = 1  # the first release attempt fails: retried, done waits for it
    try:
        for notif, timeout in ((b"now", 5.0), (b"later", 5.0), (b"stuck", 0.2), (b"err", 5.0)):
            transport.submit("peer", [1, 2, 3], [7, 8, 9], notif, timeout=timeout,
                             done=done_for(notif))  # fmt: skip
        assert finished.wait(10), outcomes
        assert outcomes[b"now"] is None and outcomes[b"later"] is None
        assert isinstance(outcomes[b"stuck"], TransferError)
        assert "stalled" in str(outcomes[b"stuck"])
        assert isinstance(outcomes[b"err"], TransferError)
        assert sorted(agent.released) == [b"err", b"later", b"now", b"stuck"]
        assert agent.posted == [([1, 2, 3], [7, 8, 9])] * 4  # one WRITE per chunk, all pages
        assert transport.live_count() == 0 and not transport.peer_busy("peer")
        # An unknown peer fails at once, as peer_lost, without a handle.
        lost: list[TransferError | None] = []
        transport.submit("gone", [1], [1], b"x", timeout=1.0, done=lost.append)
        assert lost and lost[0] is not None and lost[0].peer_lost
    finally:
        with transport._lock:
            transport._closed = True
            transport._wake.notify_all()


def test_prefill_into_the_pool_writes_the_same_bytes_as_compute_then_scatter() -> None:
    model = TinyModel(CFG, torch.device("cpu"))
    a, b = KVPool(CFG, 32, torch.device("cpu")), KVPool(CFG, 32, torch.device("cpu"))
    a.tensor.fill_(3.0)
    b.tensor.fill_(-1.0)  # stale bytes in the pages: tails must be zeroed either way
    ids = [(i * 7) % CFG.vocab for i in range(5 * CFG.page_size - 3)]
    pages = [9, 10, 11, 2, 30]
    kv, last = model.prefill_chunk(ids)
    a.write_tokens(pages, kv)
    assert torch.equal(model.prefill_into(b, pages, ids), last)
    idx = torch.tensor(pages)
    assert torch.equal(a.tensor[idx], b.tensor[idx])


def test_a_room_of_many_chunks_keeps_at_most_the_bound_in_flight_and_all_land() -> None:
    import threading

    from pdworker import limits
    from pdworker.server import wait_until

    hub, log = Hub(), []
    worker, _ = _prefill(hub, log, chunk_pages=1)
    decode_pool = KVPool(CFG, 64, torch.device("cpu"))
    MemoryTransport(hub, "decode", decode_pool.tensor)
    bound = limits.CHUNKS_IN_FLIGHT_PER_ROOM
    npages = 2 * bound + 1  # one chunk per page: more chunks than may be in flight
    ids = list(range(1, npages * CFG.page_size + 1))
    room, dest = 5, list(range(20, 20 + npages))
    gate = threading.Event()  # WRITEs stay on the wire until the test opens it
    seen: list[int] = []

    def before_copy() -> None:
        work = worker.work[room]
        seen.append(work.pending + work.writing)
        assert gate.wait(30)

    worker.transport.before_copy = before_copy  # type: ignore[attr-defined]

    async def main() -> None:
        result = await _start_room(worker, room, ids, dest)
        # The forward runs ahead of the stuck WRITEs only up to the bound.
        assert await wait_until(lambda: log.count("submit") == bound, 30)
        assert worker.work[room].pending + worker.work[room].writing == bound
        gate.set()
        answer = await asyncio.wait_for(result, 30)
        assert answer["ok"] and answer["kv_bytes"] == npages * CFG.page_bytes, answer
        await worker.stop()

    asyncio.run(main())
    assert log.count("submit") == npages
    assert max(seen) == bound and len(seen) == npages, seen
    assert all(bool((decode_pool.tensor[p] != 0).any()) for p in dest)  # every chunk landed


def test_prefill_transfer_time_is_wire_time_not_the_forward_between_chunks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import pdworker.prefill.shards as shards_module

    clock = [0.0]
    monkeypatch.setattr(shards_module, "mono", lambda: clock[0])
    worker, _ = _prefill(Hub(), [], chunk_pages=1)
    work = RoomWork(ids=[1])

    def at(t: float, step: int) -> None:
        clock[0] = t
        worker.shards.wire(work, step)

    at(0.0, +1)  # chunk 0 posted
    at(1.0, +1)  # chunk 1 posted while chunk 0 is on the wire
    at(2.0, -1)
    at(3.0, -1)  # nothing on the wire from 3.0 ...
    at(5.0, +1)  # ... to 5.0 (the room computed its next chunk): not transfer time
    at(5.5, -1)
    assert work.wire_seconds == pytest.approx(3.5)
    assert work.on_wire == 0


def test_notifications_are_drained_by_the_progress_thread_in_order_and_none_is_lost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """NIXL's own progress thread is off: the transport's thread progresses UCX by draining
    notifications into a bounded buffer, and `poll_notifs` (decode's event loop) never calls
    NIXL. Over the bound draining pauses; what NIXL still holds is not lost."""
    from pdworker.server import wait_until
    from pdworker.transfer import nixl as transfer

    transport, agent = _fake_transport()
    sent = [f"kv:1:{i}".encode() for i in range(10)]
    agent.inbox = sent[:5]
    got: list[bytes] = []

    async def main() -> bool:
        def drained() -> bool:
            got.extend(transport.poll_notifs().get("peer", []))
            return len(got) == 5

        return await wait_until(drained, 10)

    try:
        assert asyncio.run(main()), got
        assert got == sent[:5]
        assert agent.drain_threads == {"nixl-progress"}  # never the caller's thread
    finally:
        with transport._lock:
            transport._closed = True
            transport._wake.notify_all()
        transport._progress.join(5)
    # The bound, step by step (the thread has stopped): three buffered, then no NIXL call
    # until the owner reads; then the rest, in order.
    monkeypatch.setattr(transfer, "MAX_BUFFERED_NOTIFS", 3)
    agent.inbox, agent.drains = sent[5:], 0
    for _ in range(5):
        transport._drain(0.0)
    assert agent.drains == 3 and agent.inbox == sent[8:]
    got = transport.poll_notifs()["peer"]
    for _ in range(3):
        transport._drain(0.0)
    got += transport.poll_notifs()["peer"]
    assert got == sent[5:] and transport.poll_notifs() == {}


class DeviceEvent:
    """A CUDA event stand-in whose kernels finish only when the test says so (`query` is
    False until then); `synchronize` is what a waiting thread would block on."""

    def __init__(self, log: list[str], finished: Any) -> None:
        self.log = log
        self.finished = finished  # a threading.Event: the device reached this event

    def record(self) -> None:
        self.log.append("record")

    def synchronize(self) -> None:
        self.log.append("wait")
        assert self.finished.wait(30)

    def query(self) -> bool:
        return bool(self.finished.is_set())


def test_a_failed_room_keeps_its_pages_until_its_kernels_finished() -> None:
    """The room fails before its WRITE is posted (its decode is lost), so no transfer thread
    waits for the chunk's fence; its pages must still not go back to the pool (where another
    room's stream could rewrite them) while the kernels that write them may still run."""
    import threading

    from pdworker.contract import KVPoll
    from pdworker.server import wait_until

    hub, log = Hub(), []
    worker, pool = _prefill(hub, log, chunk_pages=2)
    MemoryTransport(hub, "decode", KVPool(CFG, 64, torch.device("cpu")).tensor)
    finished = threading.Event()
    worker.ordering = Ordering(
        torch.device("cpu"), event_factory=lambda: DeviceEvent(log, finished)
    )
    room, ids = 9, list(range(1, 9))  # 2 pages, one chunk

    async def main() -> None:
        result = await _start_room(worker, room, ids, [1, 2])
        worker.peers["decode"].dead = True  # lost before the forward's first WRITE is posted
        work = worker.work[room]

        def forward_over() -> bool:
            return work.forward_done and not work.pending and not work.writing

        assert await wait_until(forward_over, 30)
        assert worker.table.status(room) == KVPoll.Failed
        worker.settler.settle(time.monotonic())  # and the settle loop runs all along
        assert len(pool.pages.pages_of(room)) == 2, "pages freed while kernels still write them"
        assert not result.done()
        finished.set()  # the device catches up: the room is settled without further prodding
        answer = await asyncio.wait_for(result, 30)
        assert not answer["ok"] and answer["reason"] == "peer_lost", answer
        assert pool.pages.pages_of(room) == [] and pool.pages.owners == 0
        await worker.stop()

    asyncio.run(main())
    assert "submit" not in log  # nothing was posted, so nothing waited on the fences for us


def test_a_compute_call_that_raises_drains_its_stream_before_the_pages_can_go() -> None:
    log: list[str] = []
    worker, _ = _prefill(Hub(), log, chunk_pages=2)
    work = RoomWork(ids=[1, 2, 3])

    def broken(*_: Any) -> Any:
        raise RuntimeError("kernel launch failed half way")

    worker.model.prefill_into = broken  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="half way"):
        worker.forward.compute_chunk([0], [1, 2, 3], None, work)
    assert log == ["record", "wait"]  # synchronized on its stream, then re-raised
    assert work.fences == []


def test_a_cancelled_decode_frees_its_pages_only_after_the_kv_read_returned() -> None:
    """The client goes away while decode verifies and copies the landed KV on a compute thread:
    the cleanup must not hand the pages back (a new room's WRITE could land in them) while that
    call still reads them. The compute call itself checks that its pages are still the room's
    when it ends."""
    import threading
    from types import SimpleNamespace

    from pdworker.contract import KVPoll
    from pdworker.decode import DecodeWork, DecodeWorker
    from pdworker.server import wait_until

    cfg = WorkerConfig(role="decode", model=CFG, device="cpu", kv_pages=16, bootstrap_token="k")
    pool = KVPool(CFG, cfg.kv_pages, torch.device("cpu"))
    worker = DecodeWorker(cfg, TinyModel(CFG, torch.device("cpu")), pool,
                          MemoryTransport(Hub(), "decode", pool.tensor))  # fmt: skip
    room, ids = 31, list(range(1, 10))  # 3 pages
    entered, release = threading.Event(), threading.Event()
    owned_when_read_ended: list[list[int]] = []

    def slow_read(work: DecodeWork) -> tuple[bool, torch.Tensor]:
        entered.set()
        assert release.wait(30)
        owned_when_read_ended.append(pool.pages.pages_of(room))
        return True, torch.zeros(1)

    async def ensure(_address: str) -> Any:
        return SimpleNamespace(agent="p", address="127.0.0.1:9", pod="p", incarnation="p-1")

    async def nothing(*_: Any) -> None:
        return None

    worker._verify_and_read = slow_read  # type: ignore[method-assign]
    worker.links.ensure = ensure  # type: ignore[method-assign]
    worker.links.register_room = nothing  # type: ignore[method-assign]
    worker.links.send_abort = nothing  # type: ignore[method-assign]

    async def main() -> None:
        worker.table.create(room, "prealloc", time.monotonic())
        work = DecodeWork(ids, 4, "127.0.0.1:9", asyncio.get_running_loop().create_future())
        worker.work[room] = work
        serving = asyncio.ensure_future(worker._serve(room, work))
        assert await wait_until(
            lambda: getattr(worker.table.get(room), "phase", "") == "transfer", 30
        )
        worker.table.update(room, KVPoll.Transferring, time.monotonic())  # the KV landed
        work.n_chunks = 1
        work.done.set_result(None)
        assert await asyncio.to_thread(entered.wait, 30)
        serving.cancel()  # the client disconnected: handle_generate fails the room, cleans up
        with pytest.raises(asyncio.CancelledError):
            await serving
        worker._fail(room, "aborted", "client disconnected")
        cleanup = asyncio.ensure_future(worker._cleanup(room, work))
        # Give a cleanup that does not wait for the read the time to free the pages (this
        # bounded wait only lets the bug show; the read's own check below is the assertion).
        await asyncio.wait({cleanup}, timeout=1.0)
        release.set()
        await asyncio.wait_for(cleanup, 30)
        assert pool.pages.owners == 0 and worker.table.get(room) is None

    asyncio.run(main())
    assert len(owned_when_read_ended) == 1 and len(owned_when_read_ended[0]) == 3


# -- every loop survives an error in one of its rounds ---------------------------------------


def test_the_progress_thread_survives_a_failing_round() -> None:
    """Every deadline and release depends on the progress thread: a round that raises is
    logged and the next one runs (before, the thread ended and WRITEs hung forever)."""
    import threading

    from pdworker.transfer import TransferError

    transport, agent = _fake_transport()
    real_drain = transport._drain
    broken = [2]
    failed_twice = threading.Event()

    def drain(now: float) -> None:
        if broken[0]:
            broken[0] -= 1
            if not broken[0]:
                failed_twice.set()
            raise RuntimeError("a bug in one round")
        real_drain(now)

    transport._drain = drain  # type: ignore[method-assign]
    finished = threading.Event()
    outcome: list[TransferError | None] = []
    agent.states = {b"later": ["PROC", "PROC", "DONE"]}
    try:
        # The idle thread drains every 10 ms: without the guard it never fails a second time.
        assert failed_twice.wait(10), "the progress thread stopped after one failing round"
        transport.submit("peer", [1], [2], b"later", timeout=5.0,
                         done=lambda err: (outcome.append(err), finished.set()))  # fmt: skip
        assert finished.wait(10), "the progress thread died with a failing round"
        assert outcome == [None]
        assert agent.released == [b"later"] and transport.live_count() == 0
    finally:
        with transport._lock:
            transport._closed = True
            transport._wake.notify_all()


def _decode_worker(**cfg: Any) -> Any:
    from pdworker.decode import DecodeWorker

    config = WorkerConfig(role="decode", model=CFG, device="cpu", kv_pages=16,
                          bootstrap_token="k", **cfg)  # fmt: skip
    pool = KVPool(CFG, config.kv_pages, torch.device("cpu"))
    return DecodeWorker(config, TinyModel(CFG, torch.device("cpu")), pool,
                        MemoryTransport(Hub(), "decode", pool.tensor))  # fmt: skip


def test_one_bad_notification_loses_no_other_of_its_batch() -> None:
    """The transport hands a batch over once; a message that raises must not take the rest."""
    worker = _decode_worker()
    seen: list[bytes] = []

    def on_notif(agent: str, raw: bytes) -> None:
        if raw == b"bad":
            raise RuntimeError("a bug handling one message")
        seen.append(raw)

    worker.inbox.on_notif = on_notif  # type: ignore[method-assign]
    worker.transport.poll_notifs = lambda: {"p": [b"one", b"bad", b"two"], "q": [b"three"]}
    worker.inbox.pump()
    assert seen == [b"one", b"two", b"three"]


def test_the_decode_watchdog_judges_deadlines_even_when_the_pump_fails() -> None:
    from pdworker.contract import KVPoll
    from pdworker.server import wait_until

    worker = _decode_worker(waiting_timeout=0.05)

    def pump() -> None:
        raise RuntimeError("a broken transport")

    worker.inbox.pump = pump  # type: ignore[method-assign]

    async def main() -> None:
        worker.table.create(7, "transfer", time.monotonic())
        watchdog = asyncio.ensure_future(worker.inbox.watchdog_loop())
        try:
            assert await wait_until(lambda: worker.table.status(7) == KVPoll.Failed, 4)
        finally:
            watchdog.cancel()
        assert worker.table.get(7).reason == "waiting_timeout"

    asyncio.run(main())


def test_one_links_failure_does_not_stop_the_others_heartbeats() -> None:
    """A surprise while handling one prefill's heartbeat (here the lost-callback raises) must
    not end the loop: the other prefill would then see no heartbeat and drop this decode."""
    from pdworker.decode.prefill_link import PrefillLink, PrefillLinks

    cfg = WorkerConfig(role="decode", model=CFG, device="cpu", kv_pages=16,
                       bootstrap_token="k", heartbeat_interval=0.01)  # fmt: skip
    pool = KVPool(CFG, cfg.kv_pages, torch.device("cpu"))

    def on_lost(address: str, why: str) -> None:
        raise RuntimeError("a bug in the lost-callback")

    links = PrefillLinks(cfg, MemoryTransport(Hub(), "decode", pool.tensor), pool, on_lost)
    beats: dict[str, int] = {"a": 0, "b": 0}
    third_beat_to_b = asyncio.Event()

    async def post(address: str, path: str, body: Any, limit_s: float) -> tuple[int, Any]:
        beats[address] += 1
        if beats["b"] >= 3:
            third_beat_to_b.set()
        # "a" restarted (new incarnation): lost -> the callback raises; "b" is healthy.
        return 200, {"incarnation": "new" if address == "a" else "b-1", "known": True}

    links.post = post  # type: ignore[method-assign]

    async def main() -> None:
        for address, incarnation in (("a", "a-1"), ("b", "b-1")):
            links.links[address] = PrefillLink(address, registered=True, incarnation=incarnation)
        loop = asyncio.ensure_future(links.heartbeat_loop())
        try:
            # Without the guard the loop ends at the first round, having beaten "b" once.
            await asyncio.wait_for(third_beat_to_b.wait(), 5)
        finally:
            loop.cancel()
        assert beats["b"] >= 3 and beats["a"] >= 1, beats

    asyncio.run(main())
