"""The wire side of a room's chunk pipeline: transfer threads that post each chunk's WRITE.

Why a module of its own: this is the only prefill code that runs on transfer threads and touches
decode memory. Chunks are sharded over `--transfer-threads` threads by room, so one room's chunks
are posted in order; a thread waits for the chunk's fence (the kernels that wrote its pages have
finished), posts ONE NIXL WRITE over the chunk's pages and returns at once: the transport's
progress thread reports the end of the WRITE (`chunk_done`), after the handle is released. A
room counts its chunks as `pending` (queued) then `writing` (posted, not released), never both
and never neither, so the settle loop frees pages and answers a room only once nothing can touch
them. Wire time is accounted here: the seconds during which at least one of the room's WRITEs was
posted. A peer that NIXL reports as disconnected is handed to the decode links (`on_peer_lost`).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

from pdworker.contract import KVChunk, KVPoll, encode_notification
from pdworker.prefill.state import ChunkJob, PrefillState, RoomWork
from pdworker.transfer import TransferError

log = logging.getLogger(__name__)
mono = time.monotonic


class Shards:
    def __init__(self, state: PrefillState, on_peer_lost: Callable[[str, str], None]) -> None:
        self.s = state
        self.on_peer_lost = on_peer_lost  # (event loop) the agent NIXL lost, and why
        self.queues: list[queue.Queue[ChunkJob | None]] = [
            queue.Queue() for _ in range(max(1, state.cfg.transfer_threads))
        ]
        self.threads: list[threading.Thread] = []

    def start(self) -> None:
        for i, shard in enumerate(self.queues):
            t = threading.Thread(target=self._main, args=(shard,), name=f"xfer-{i}", daemon=True)
            t.start()
            self.threads.append(t)

    def stop(self) -> None:
        for shard in self.queues:
            shard.put(None)

    def enqueue(self, job: ChunkJob, work: RoomWork) -> None:
        """(event loop) hand a computed chunk to its room's transfer thread."""
        with self.s.lock:
            work.pending += 1
        self.queues[job.room % len(self.queues)].put(job)

    def _main(self, shard: queue.Queue[ChunkJob | None]) -> None:
        s = self.s
        while True:
            job = shard.get()
            if job is None:
                return
            try:
                self._post(job)
            except Exception:
                log.exception("transfer job for room %d crashed", job.room)
                s.table.fail(job.room, "transfer_error", mono(), "transfer job crashed")
                s.wake_settle()
            finally:
                with s.lock:
                    work = s.work.get(job.room)
                    freed = work is not None and job.queued  # never posted: its slot is free
                    if work is not None and freed:
                        work.pending -= 1
                if freed:
                    s.wake_settle(work)

    def _post(self, job: ChunkJob) -> None:
        """Post one chunk's WRITE (after its pages are computed) and return without waiting."""
        s, room = self.s, job.room
        with s.lock:
            status = s.table.status(room)
            binding = s.bindings.get(room)
            peer = s.peers.get(binding.agent) if binding else None
            work = s.work.get(room)
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
            if not s.legacy:
                reason = "peer_lost" if peer is None or peer.dead else "aborted"
                s.table.fail(room, reason, mono(), "transfer skipped: room has no live destination")
                s.wake_settle()
            # legacy: SGLang's skip guard just `continue`s and leaves the room as it is.
            return
        agent = binding.agent
        try:
            job.fence.wait()  # NIXL reads the pages: the kernels that wrote them must be done
        except Exception as exc:
            self.chunk_done(job, work, agent, TransferError(f"device error: {exc!r}"))
            return
        notif = encode_notification(KVChunk(room, job.index))
        reported: list[bool] = []

        def done(err: TransferError | None) -> None:
            reported.append(True)
            self.wire(work, -1)
            self.chunk_done(job, work, agent, err)

        self.wire(work, +1)
        try:
            s.transport.submit(
                agent,
                job.local_pages,
                job.remote_pages,
                notif,
                timeout=s.cfg.transfer_timeout,
                done=done,
            )
        except Exception as exc:  # the transport broke its promise: still end the chunk once
            log.exception("posting a WRITE of room %d crashed", room)
            if not reported:
                self.wire(work, -1)
                self.chunk_done(job, work, agent, TransferError(f"posting failed: {exc!r}"))

    def wire(self, work: RoomWork, step: int) -> None:
        """Count a WRITE of the room onto (+1) or off (-1) the wire; accrue the wire time."""
        now = mono()
        with self.s.lock:
            if step > 0 and work.on_wire == 0:
                work.wire_since = now
            work.on_wire += step
            if step < 0 and work.on_wire == 0:
                work.wire_seconds += now - work.wire_since

    def chunk_done(
        self, job: ChunkJob, work: RoomWork, agent: str, err: TransferError | None
    ) -> None:
        """(transport thread) one chunk's WRITE finished and its handle is released."""
        s, room = self.s, job.room
        try:
            if err is not None:
                reason = "peer_lost" if err.peer_lost else "transfer_error"
                s.table.fail(room, reason, mono(), str(err))
                if err.peer_lost and s.loop is not None:
                    s.loop.call_soon_threadsafe(self.on_peer_lost, agent, str(err))
                return
            moved = len(job.local_pages) * s.cfg.model.page_bytes
            s.metrics.kv_bytes.inc(moved)
            with s.lock:
                work.bytes += moved
                work.chunks_done += 1
                complete = work.chunks_done == job.total and work.meta is not None
                meta = work.meta
            if s.legacy:
                s.table.update(room, KVPoll.Transferring, mono())  # the late write
            if complete and meta is not None and s.table.status(room) != KVPoll.Failed:
                try:
                    s.transport.notify(agent, meta)
                except TransferError as exc:
                    s.table.fail(room, "transfer_error", mono(), str(exc))
                    return
                s.table.update(room, KVPoll.Success, mono())
        finally:
            with s.lock:
                work.writing -= 1
            s.wake_settle(work)
