"""The prefill role: wait for decode's handshake, compute KV in chunks, WRITE it into decode.

Mirrors SGLang's prefill (bootstrap queue -> forward -> inflight queue) with its NIXL bugs fixed:
the bootstrap wait and the inflight queue have deadlines (the watchdog clock starts when a room
enters the inflight queue, so a long prefill is legal), transfers are sharded over threads by
room and every poll has a deadline, decode aborts are acknowledged only after in-flight writes
into decode memory have drained, prefill-side failures are pushed to decode, and a decode that
stops heart-beating or comes back as a new incarnation has its rooms failed (`peer_lost`).
The `legacy-status-race` fault restores SGLang's status race; `no-inflight-watchdog` drops the
inflight deadline.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import logging
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from pdworker import integrity, limits
from pdworker.compute import compute_executor
from pdworker.config import WorkerConfig, parse_ids
from pdworker.contract import KVChunk, KVFail, KVMeta, KVPoll, encode_notification
from pdworker.handshake import PeerRegistration, Refused
from pdworker.metrics import WorkerMetrics
from pdworker.model import KVPool, TinyModel
from pdworker.ordering import Fence, Ordering
from pdworker.rooms import Peer, RoomRejected, RoomTable
from pdworker.server import (
    BadRequest,
    FailSelector,
    client_error,
    error,
    parse_room,
    read_json,
    wait_until,
)
from pdworker.transfer import TransferError, Transport

IDLE_POLL_S = 0.05
log = logging.getLogger(__name__)
mono = time.monotonic


@dataclass
class DecodePeer:
    agent: str
    peer: Peer
    num_pages: int
    last_seen: float
    dead: bool = False


@dataclass
class Binding:
    agent: str
    pages: list[int]
    at: float


@dataclass
class ChunkJob:
    room: int
    index: int
    total: int
    local_pages: list[int]
    remote_pages: list[int]
    fence: Fence  # passed once the kernels that wrote local_pages have finished
    queued: bool = True  # counted in RoomWork.pending (until it moves to RoomWork.writing)


@dataclass
class RoomWork:
    """Prefill bookkeeping for one room (kept in Room.data['work'])."""

    ids: list[int]
    pending: int = 0  # chunk jobs queued for a transfer thread, not yet posted
    writing: int = 0  # chunk writes touching decode memory right now (posted, not released)
    forward_started: bool = False
    forward_done: bool = False
    chunks_done: int = 0
    bytes: int = 0
    # Wire time (pdworker_kv_transfer_seconds on prefill): the seconds during which at least one
    # of the room's WRITEs was posted and not yet released. Gaps in which the room only waited
    # for its own next chunk's forward are not transfer time; they are in forward_seconds.
    on_wire: int = 0
    wire_since: float = 0.0
    wire_seconds: float = 0.0
    forward_seconds: float = 0.0  # compute-thread time of this room's chunks (forward, scatter)
    slot: asyncio.Event = field(default_factory=asyncio.Event)  # a chunk of the room finished
    # One fence per computed chunk (appended by the compute thread, under PrefillWorker.lock).
    # The room's pages are freed only once all have passed: a failed room skips its queued
    # WRITEs without waiting for their fences, and `forward_done` means the Python calls
    # returned, not that the device finished the kernels they launched.
    fences: list[Fence] = field(default_factory=list)
    meta: builtins.bytes | None = None  # set with the last chunk: first token and KV checksum
    decode_aborted: bool = False
    result: dict[str, Any] = field(default_factory=dict)


class PrefillWorker:
    def __init__(
        self,
        cfg: WorkerConfig,
        model: TinyModel,
        pool: KVPool,
        transport: Transport,
    ) -> None:
        self.cfg = cfg
        self.model = model
        self.pool = pool
        self.transport = transport
        self.legacy = cfg.faults.legacy_status_race
        deadlines: dict[str, float | None] = {
            "bootstrap": cfg.bootstrap_timeout,
            "inflight": None if cfg.faults.no_inflight_watchdog else cfg.inflight_timeout,
        }
        self.table = RoomTable("prefill", deadlines=deadlines, legacy=self.legacy)
        self.metrics = WorkerMetrics("prefill", cfg.incarnation, self.table, pool.pages)
        self.peers: dict[str, DecodePeer] = {}
        self.bindings: dict[int, Binding] = {}
        self.pending_bindings: dict[int, Binding] = {}
        self.waiters: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.work: dict[int, RoomWork] = {}
        self.lock = threading.Lock()  # guards bindings/peers/work counters across threads
        self.registering: set[str] = set()  # agents whose NIXL metadata is being loaded
        self.peer_slots = asyncio.Semaphore(limits.PEER_REGISTRATIONS_AT_ONCE)
        self.shards: list[queue.Queue[ChunkJob | None]] = [
            queue.Queue() for _ in range(max(1, cfg.transfer_threads))
        ]
        self.threads: list[threading.Thread] = []
        self.tasks: set[asyncio.Task[Any]] = set()
        self.forward_slots = asyncio.Semaphore(cfg.max_running)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.stopping = False
        self.ordering = Ordering(pool.device)
        self.compute: ThreadPoolExecutor = compute_executor(cfg.compute_threads, pool.device)
        self.wake = asyncio.Event()  # a room may be ready to settle

    # -- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        for i, shard in enumerate(self.shards):
            t = threading.Thread(
                target=self._shard_main, args=(shard,), name=f"xfer-{i}", daemon=True
            )
            t.start()
            self.threads.append(t)
        self._spawn(self._settle_loop())

    async def stop(self) -> None:
        self.stopping = True
        now = mono()
        for room in self.table.select(now):
            self.table.fail(room, "aborted", now, "prefill shutting down")
        await wait_until(
            lambda: not any(w.writing for w in list(self.work.values())), self.cfg.transfer_timeout
        )
        self._settle(mono())
        for shard in self.shards:
            shard.put(None)
        for task in self.tasks:
            task.cancel()
        self.compute.shutdown(wait=False, cancel_futures=True)
        self.transport.close()

    def ready(self) -> bool:
        return not self.stopping and self.loop is not None

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    # -- request path --------------------------------------------------------------------
    async def handle_generate(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await read_json(request)
            if not isinstance(body, dict):
                raise BadRequest("body must be a JSON object")
            room = parse_room(body.get("bootstrap_room"))
            ids = parse_ids(body.get("input_ids"))
        except BadRequest as exc:
            return client_error(exc)
        if self.stopping:
            return error(503, "prefill is shutting down", reason="aborted")
        if len(self.table) >= self.cfg.max_rooms:
            return error(429, f"prefill holds {self.cfg.max_rooms} rooms; retry later")
        now = mono()
        try:
            self.table.create(room, "bootstrap", now)
        except RoomRejected as exc:
            if exc.reason != "duplicate":
                self.metrics.failed.labels(reason=exc.reason).inc()
            return error(409 if exc.reason == "duplicate" else 500, exc.detail, reason=exc.reason)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        with self.lock:
            self.work[room] = RoomWork(ids=ids)
            early = self.pending_bindings.pop(room, None)
        self.waiters[room] = future
        if early is not None:
            problem = self._bind(room, early)
            if problem:
                self.table.fail(room, "transfer_error", now, problem)
        try:
            result = await future
        except asyncio.CancelledError:
            self.abort(room, "client disconnected")
            raise
        finally:
            self.waiters.pop(room, None)
        return web.json_response(result, status=200 if result["ok"] else 500)

    def abort(self, room: int, detail: str) -> None:
        if not self.table.fail(room, "aborted", mono(), detail) and self.table.get(room) is None:
            self.table.tombstone(room, "aborted", detail)

    def _bind(self, room: int, binding: Binding) -> str | None:
        """Attach decode's destination pages to a room and start its forward pass."""
        with self.lock:
            work = self.work.get(room)
            peer = self.peers.get(binding.agent)
            if work is None or peer is None or peer.dead:
                return "decode peer is gone"
            if room in self.bindings:
                return "room is already bound"  # first bind wins, never re-bound
            needed = self.cfg.model.pages_for(len(work.ids))
            if len(binding.pages) != needed:
                return f"decode sent {len(binding.pages)} pages, room needs {needed}"
            if any(not 0 <= p < peer.num_pages for p in binding.pages):
                return "decode page index out of range"
            self.bindings[room] = binding
            work.forward_started = True
        self.table.bind(room, peer.peer)
        self.table.update(room, KVPoll.WaitingForInput, mono())
        self.table.set_phase(room, "forward", mono())
        self._spawn(self._forward(room))
        return None

    async def _forward(self, room: int) -> None:
        cfg = self.cfg
        work = self.work[room]
        loop = asyncio.get_running_loop()
        computing: asyncio.Future[Any] | None = None
        try:
            async with self.forward_slots:
                entry = self.table.get(room)
                if entry is None or entry.status == KVPoll.Failed:
                    return
                npages = cfg.model.pages_for(len(work.ids))
                local = self.pool.pages.alloc(room, npages)
                deadline = mono() + cfg.transfer_timeout
                while local is None:
                    if mono() > deadline or self.table.status(room) in (None, KVPoll.Failed):
                        self.table.fail(room, "transfer_error", mono(), "prefill KV pool exhausted")
                        return
                    await asyncio.sleep(0.01)
                    local = self.pool.pages.alloc(room, npages)
                with self.lock:
                    binding = self.bindings.get(room)
                if binding is None:
                    return
                remote = binding.pages
                step = cfg.pages_per_chunk
                chunks = [local[i : i + step] for i in range(0, npages, step)]
                span = step * cfg.model.page_size
                fences: list[Fence] = []
                for index, pages in enumerate(chunks):
                    # The fixed worker stops an aborted forward; the legacy one runs on and its
                    # status writes resurrect the failed room (SGLang's race).
                    if not self.legacy and self.table.status(room) in (None, KVPoll.Failed):
                        return
                    if cfg.prefill_chunk_ms:
                        await asyncio.sleep(cfg.prefill_chunk_ms / 1000)  # a real model's forward
                    # Chunk n+1 is computed while chunk n's WRITE is in flight; at most
                    # CHUNKS_IN_FLIGHT_PER_ROOM of a room's chunks wait for or are on the wire.
                    if not await self._chunk_slot(room, work):
                        self.table.fail(room, "transfer_error", mono(), "earlier chunks stalled")
                        return  # a no-op fail if the room had failed already
                    last = index == len(chunks) - 1
                    ids = work.ids[index * span : (index + 1) * span]
                    # Forward, page scatter and the KV fingerprint run on a compute thread (a CUDA
                    # stream of its own on GPU): the event loop keeps answering heartbeats.
                    computing = loop.run_in_executor(
                        self.compute,
                        self._compute_chunk,
                        pages,
                        ids,
                        (local, fences) if last else None,
                        work,
                    )
                    # shield: a cancelled forward must not lose track of a running compute call
                    fence, result, seconds = await asyncio.shield(computing)
                    work.forward_seconds += seconds
                    fences.append(fence)
                    job = ChunkJob(
                        room,
                        index,
                        len(chunks),
                        pages,
                        remote[index * step : index * step + len(pages)],
                        fence,
                    )
                    if result is not None:
                        work.result = result
                        work.meta = encode_notification(
                            KVMeta(room, len(chunks), result["first_token"], result["kv_checksum"])
                        )
                        # The room enters the inflight queue now: the watchdog clock starts here.
                        self.table.set_phase(room, "inflight", mono())
                    self.table.update(room, KVPoll.Transferring, mono())
                    with self.lock:
                        work.pending += 1
                    self.shards[room % len(self.shards)].put(job)
        except Exception as exc:  # a crashed forward must still end the room, with a reason
            log.exception("forward pass of room %d crashed", room)
            self.table.fail(room, "transfer_error", mono(), f"forward pass crashed: {exc!r}")
        finally:
            if computing is not None and not computing.done():
                # Cancelled while a compute thread still writes our pages: the pages stay ours
                # until it has finished.
                computing.add_done_callback(lambda _: self._forward_finished(work))
            else:
                self._forward_finished(work)

    def _forward_finished(self, work: RoomWork) -> None:
        work.forward_done = True
        self.wake.set()

    def _compute_chunk(
        self,
        pages: list[int],
        ids: list[int],
        room: tuple[list[int], list[Fence]] | None,
        work: RoomWork | None = None,
    ) -> tuple[Fence, dict[str, Any] | None, float]:
        """(compute thread) KV of `ids` into `pages`; on the last chunk (`room` = all the room's
        pages and the earlier chunks' fences) also the first token and the room's KV checksum.
        Returns a fence after all of it (NIXL must wait for it), also kept in `work.fences` so
        the pages are not freed before it passed. If anything raises after kernels were
        launched, the stream is drained first: the caller then frees pages nothing writes."""
        began = time.perf_counter()
        try:
            last_hidden = self.model.prefill_into(self.pool, pages, ids)
            result = None
            if room is not None:
                room_pages, earlier = room
                for fence in earlier:  # earlier chunks ran on other threads' streams
                    fence.wait()
                spec = integrity.plan(self.cfg.kv_verify, len(room_pages))
                result = {
                    "first_token": self.model.first_token(last_hidden),
                    "kv_checksum": integrity.checksum(self.pool.tensor, room_pages, spec),
                }
            fence = self.ordering.fence()
        except BaseException:
            with contextlib.suppress(Exception):  # a broken device: nothing more will run
                self.ordering.sync()
            raise
        if work is not None:
            with self.lock:
                work.fences.append(fence)
        return fence, result, time.perf_counter() - began

    async def _chunk_slot(self, room: int, work: RoomWork) -> bool:
        """Wait until the room has a chunk slot free: True, or False at the transfer deadline or
        once the fixed worker's room failed. Woken by every chunk that ends (no polling)."""
        bound = limits.CHUNKS_IN_FLIGHT_PER_ROOM
        deadline = mono() + self.cfg.transfer_timeout
        while work.pending + work.writing >= bound:
            if not self.legacy and self.table.status(room) in (None, KVPoll.Failed):
                return False
            work.slot.clear()
            if work.pending + work.writing < bound:  # a chunk ended between the check and clear
                break
            remaining = deadline - mono()
            if remaining <= 0:
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(work.slot.wait(), remaining)
        return True

    # -- transfer shards (threads) -------------------------------------------------------
    def _shard_main(self, shard: queue.Queue[ChunkJob | None]) -> None:
        while True:
            job = shard.get()
            if job is None:
                return
            try:
                self._post_job(job)
            except Exception:
                log.exception("transfer job for room %d crashed", job.room)
                self.table.fail(job.room, "transfer_error", mono(), "transfer job crashed")
                self._wake_settle()
            finally:
                with self.lock:
                    work = self.work.get(job.room)
                    freed = work is not None and job.queued  # never posted: its slot is free
                    if work is not None and freed:
                        work.pending -= 1
                if freed:
                    self._wake_settle(work)

    def _post_job(self, job: ChunkJob) -> None:
        """Post one chunk's WRITE (after its pages are computed) and return without waiting."""
        room = job.room
        with self.lock:
            status = self.table.status(room)
            binding = self.bindings.get(room)
            peer = self.peers.get(binding.agent) if binding else None
            work = self.work.get(room)
            go = (
                status not in (None, KVPoll.Failed)
                and binding is not None
                and peer is not None
                and not peer.dead
                and work is not None
            )
            if go and work is not None:
                # pending -> writing in one step: a chunk is counted once, and never by neither
                work.writing += 1
                work.pending -= 1
                job.queued = False
        if not go or binding is None or work is None:
            if not self.legacy:
                reason = "peer_lost" if peer is None or peer.dead else "aborted"
                self.table.fail(
                    room, reason, mono(), "transfer skipped: room has no live destination"
                )
                self._wake_settle()
            # legacy: SGLang's skip guard just `continue`s and leaves the room as it is.
            return
        agent = binding.agent
        try:
            job.fence.wait()  # NIXL reads the pages: the kernels that wrote them must be done
        except Exception as exc:
            self._chunk_done(job, work, agent, TransferError(f"device error: {exc!r}"))
            return
        notif = encode_notification(KVChunk(room, job.index))
        reported: list[bool] = []

        def done(err: TransferError | None) -> None:
            reported.append(True)
            self._wire(work, -1)
            self._chunk_done(job, work, agent, err)

        self._wire(work, +1)
        try:
            self.transport.submit(
                agent,
                job.local_pages,
                job.remote_pages,
                notif,
                timeout=self.cfg.transfer_timeout,
                done=done,
            )
        except Exception as exc:  # the transport broke its promise: still end the chunk once
            log.exception("posting a WRITE of room %d crashed", room)
            if not reported:
                self._wire(work, -1)
                self._chunk_done(job, work, agent, TransferError(f"posting failed: {exc!r}"))

    def _wire(self, work: RoomWork, step: int) -> None:
        """Count a WRITE of the room onto (+1) or off (-1) the wire; accrue the wire time."""
        now = mono()
        with self.lock:
            if step > 0 and work.on_wire == 0:
                work.wire_since = now
            work.on_wire += step
            if step < 0 and work.on_wire == 0:
                work.wire_seconds += now - work.wire_since

    def _chunk_done(
        self, job: ChunkJob, work: RoomWork, agent: str, err: TransferError | None
    ) -> None:
        """(transport thread) one chunk's WRITE finished and its handle is released."""
        room = job.room
        try:
            if err is not None:
                reason = "peer_lost" if err.peer_lost else "transfer_error"
                self.table.fail(room, reason, mono(), str(err))
                if err.peer_lost and self.loop is not None:
                    self.loop.call_soon_threadsafe(self._peer_lost, agent, str(err))
                return
            moved = len(job.local_pages) * self.cfg.model.page_bytes
            self.metrics.kv_bytes.inc(moved)
            with self.lock:
                work.bytes += moved
                work.chunks_done += 1
                complete = work.chunks_done == job.total and work.meta is not None
                meta = work.meta
            if self.legacy:
                self.table.update(room, KVPoll.Transferring, mono())  # the late write
            if complete and meta is not None and self.table.status(room) != KVPoll.Failed:
                try:
                    self.transport.notify(agent, meta)
                except TransferError as exc:
                    self.table.fail(room, "transfer_error", mono(), str(exc))
                    return
                self.table.update(room, KVPoll.Success, mono())
        finally:
            with self.lock:
                work.writing -= 1
            self._wake_settle(work)

    def _wake_settle(self, work: RoomWork | None = None) -> None:
        """(any thread) a room may be ready to settle; `work`: one of its chunks ended."""
        if self.loop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self._woken, work)

    def _woken(self, work: RoomWork | None) -> None:
        self.wake.set()
        if work is not None:
            work.slot.set()

    # -- settling rooms, deadlines, peers ------------------------------------------------
    async def _settle_loop(self) -> None:
        while True:
            self.wake.clear()  # before the pass: a completion during it wakes the next one
            try:
                now = mono()
                self.table.expire(now)
                self._check_peers(now)
                self._settle(now)
            except Exception:
                log.exception("settle loop")
            # Poll fast only while rooms are live: an idle worker must not burn a core's share.
            # Transfer completions wake this loop at once (self.wake).
            pause = self.cfg.poll_interval if len(self.table) else IDLE_POLL_S
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), pause)

    def _settle(self, now: float) -> None:
        for entry in self.table.snapshot():
            if not entry.terminal:
                continue
            room = entry.room
            with self.lock:
                work = self.work.get(room)
                if work is not None and (work.pending or work.writing):
                    continue  # chunk jobs still hold our pages or decode's
                if work is not None and work.forward_started and not work.forward_done:
                    continue  # the forward pass still writes into our pages
                if work is not None and not _fences_passed(work):
                    continue  # kernels of the room still write its pages: settled on a later
                    # pass (the loop polls every poll_interval while the room is in the table)
                binding = self.bindings.pop(room, None)
                self.work.pop(room, None)
                peer = self.peers.get(binding.agent) if binding else None
            self.table.clear(room)
            self.pool.pages.free(room)
            if entry.status == KVPoll.Success and work is not None:
                self.metrics.completed.labels(role="prefill").inc()
                self.metrics.kv_seconds.observe(work.wire_seconds)
                self.metrics.forward_seconds.observe(work.forward_seconds)
                result = {"ok": True, "room": room, "kv_bytes": work.bytes, **work.result}
            else:
                reason = entry.reason or "aborted"
                self.metrics.failed.labels(reason=reason).inc()
                result = {"ok": False, "room": room, "reason": reason, "error": entry.detail}
                if binding and peer and not peer.dead and not (work and work.decode_aborted):
                    try:  # push the failure to decode (SGLang's NIXL backend never did)
                        self.transport.notify(
                            binding.agent, encode_notification(KVFail(room, reason))
                        )
                    except TransferError as exc:
                        log.info("could not push failure of room %d: %s", room, exc)
            future = self.waiters.get(room)
            if future is not None and not future.done():
                future.set_result(result)
        cutoff = now - self.cfg.bootstrap_timeout
        with self.lock:
            for room in [r for r, b in self.pending_bindings.items() if b.at < cutoff]:
                del self.pending_bindings[room]

    def _check_peers(self, now: float) -> None:
        for agent, peer in list(self.peers.items()):
            if agent in self.registering:
                continue  # being (re-)registered: its NIXL entry is in use
            if not peer.dead and now - peer.last_seen > self.cfg.peer_timeout:
                self._peer_lost(agent, f"no heartbeat for {self.cfg.peer_timeout:g}s")
            if peer.dead and not self.transport_busy(agent):
                with self.lock:
                    self.peers.pop(agent, None)
                self.transport.remove_peer(agent)

    def transport_busy(self, agent: str) -> bool:
        with self.lock:
            return any(
                w.writing
                for r, w in self.work.items()
                if (b := self.bindings.get(r)) and b.agent == agent
            )

    def _peer_lost(self, agent: str, why: str) -> None:
        now = mono()
        with self.lock:
            peer = self.peers.get(agent)
            if peer is None or peer.dead:
                return
            peer.dead = True
            rooms = [r for r, b in self.bindings.items() if b.agent == agent]
            for r in [r for r, b in self.pending_bindings.items() if b.agent == agent]:
                del self.pending_bindings[r]
        log.warning("decode peer %s lost (%s); failing %d rooms", agent, why, len(rooms))
        for room in rooms:
            self.table.fail(room, "peer_lost", now, f"decode {agent} lost: {why}")

    # -- admin ---------------------------------------------------------------------------
    def list_rooms(self) -> list[dict[str, Any]]:
        now = mono()
        return [r.as_dict(now) for r in self.table.snapshot()]

    async def fail_rooms(self, selector: FailSelector) -> list[int]:
        now = mono()
        rooms = self.table.select(
            now,
            rooms=selector.rooms,
            older_than=selector.older_than_seconds,
            peer_incarnation=selector.peer_incarnation,
        )
        return [r for r in rooms if self.table.fail(r, "admin", now, "failed by the admin API")]

    # -- the handshake (called by the bootstrap server with validated input) -------------
    def peer_ip(self, agent: str) -> str | None:
        with self.lock:
            known = self.peers.get(agent)
            return known.peer.ip if known is not None else None

    def _caller_owns(self, agent: str, caller_ip: str) -> DecodePeer | None:
        """The peer `agent` if it exists; Refused (403) if it was registered from elsewhere."""
        known = self.peers.get(agent)
        if known is not None and known.peer.ip != caller_ip:
            raise Refused(403, "this agent was registered from another address")
        return known

    async def register_peer(self, reg: PeerRegistration) -> None:
        """Load a decode's NIXL metadata; only once that worked, replace an older incarnation
        at the same (verified) address and fail its rooms."""
        with self.lock:
            known = self._caller_owns(reg.agent, reg.ip)
            if known is not None and not known.dead:
                known.last_seen = mono()
                return
            live = [p for p in self.peers.values() if not p.dead]
            if len(live) >= limits.MAX_DECODE_PEERS:
                raise Refused(429, f"prefill serves {limits.MAX_DECODE_PEERS} decode peers already")
            if sum(p.num_pages for p in live) + reg.num_pages > limits.MAX_TOTAL_PEER_PAGES:
                raise Refused(429, "decode peers' KV pools exceed what this prefill describes")
            if reg.agent in self.registering:
                raise Refused(409, "this agent is being registered already; retry")
            if len(self.registering) >= limits.PEER_REGISTRATIONS_QUEUED:
                raise Refused(429, "too many decode registrations at once; retry")
            self.registering.add(reg.agent)
        try:
            async with self.peer_slots:
                try:
                    await asyncio.to_thread(self._load_peer, reg)
                except TransferError as exc:
                    raise Refused(400, str(exc), reason="transfer_error") from exc
            peer = Peer(reg.pod_hint, reg.address, reg.incarnation, reg.ip)
            with self.lock:
                replaced = [
                    a
                    for a, p in self.peers.items()
                    if a != reg.agent and p.peer.address == reg.address and not p.dead
                ]
                self.peers[reg.agent] = DecodePeer(reg.agent, peer, reg.num_pages, mono())
        finally:
            with self.lock:
                self.registering.discard(reg.agent)
        for other in replaced:
            self._peer_lost(other, f"replaced by new incarnation {reg.incarnation}")
        log.info("registered decode peer %s (%s)", reg.agent, reg.address)

    def _load_peer(self, reg: PeerRegistration) -> None:
        """Build the descriptors and hand NIXL the metadata (a thread: both can be slow)."""
        descs = reg.page_descs()
        try:
            self.transport.add_peer(reg.agent, reg.metadata, descs, reg.mem_type)
        except TransferError:
            raise
        except Exception as exc:
            if type(exc).__module__.startswith("nixl"):  # NIXL refused the bytes: bad input
                raise TransferError(f"NIXL refused the metadata: {type(exc).__name__}") from exc
            raise

    def register_room(self, agent: str, caller_ip: str, room: int, pages: list[int]) -> str:
        """Attach decode's pages to a room: "bound", or "pending" until prefill sees the
        request. The first decode to bind a room owns it; nobody else can re-bind it."""
        now = mono()
        with self.lock:
            peer = self._caller_owns(agent, caller_ip)
            if peer is None or peer.dead:
                raise Refused(409, "unknown decode peer; register first", reason="peer_lost")
            if any(p >= peer.num_pages for p in pages):
                raise Refused(400, "decode page index out of range", reason="transfer_error")
            peer.last_seen = now
            owner = self.bindings.get(room) or self.pending_bindings.get(room)
            if owner is not None and owner.agent != agent:
                raise Refused(409, "room is bound to another decode", reason="aborted")
            if room in self.bindings:
                raise Refused(409, "room already registered", reason="aborted")
            if room not in self.work:
                if owner is None:
                    if len(self.pending_bindings) >= limits.MAX_PENDING_BINDINGS:
                        raise Refused(429, "too many rooms wait for their prefill request")
                    self.pending_bindings[room] = Binding(agent, pages, now)
                return "pending"
        entry = self.table.get(room)
        if entry is None or entry.terminal:
            reason = entry.reason if entry and entry.reason else "aborted"
            raise Refused(410, "room already finished", reason=reason)
        problem = self._bind(room, Binding(agent, pages, now))
        if problem:
            self.table.fail(room, "transfer_error", mono(), problem)
            raise Refused(400, problem, reason="transfer_error")
        return "bound"

    async def abort_from_decode(self, agent: str, caller_ip: str, room: int) -> bool:
        """Decode's ABORT of a room it bound; True once no WRITE into its pages is in flight."""
        with self.lock:
            self._caller_owns(agent, caller_ip)
            bound, pending = self.bindings.get(room), self.pending_bindings.get(room)
            if bound is not None and bound.agent == agent:
                del self.bindings[room]  # no write may start into decode's pages from now on
            elif pending is not None and pending.agent == agent:
                del self.pending_bindings[room]
            else:
                raise Refused(404, "this decode has no room with that id")
            work = self.work.get(room)
            if work is not None:
                work.decode_aborted = True
        if not self.table.fail(room, "aborted", mono(), "aborted by decode") and work is None:
            self.table.tombstone(room, "aborted", "aborted by decode before prefill saw it")
        # Writes into decode's pages are counted by transfer threads; poll them with a deadline.
        return work is None or await wait_until(
            lambda: not work.writing, self.cfg.transfer_timeout + 1, interval=0.002
        )

    def heartbeat(self, agent: str, caller_ip: str) -> bool:
        """Refresh a live peer; False if this prefill does not know it (decode re-registers)."""
        with self.lock:
            peer = self._caller_owns(agent, caller_ip)
            if peer is None or peer.dead:
                return False
            peer.last_seen = mono()
            return True


def _fences_passed(work: RoomWork) -> bool:
    """(under PrefillWorker.lock) whether the device finished every chunk of the room (a
    non-blocking query; passed fences are dropped so a room is not queried twice for them)."""
    while work.fences:
        try:
            if not work.fences[-1].passed():
                return False
        except Exception:  # a device error: nothing launched on it runs any more
            log.exception("querying a KV fence failed; treating it as passed")
        work.fences.pop()
    return True
