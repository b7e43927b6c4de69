"""The compute side of a room's chunk pipeline: the forward pass, chunk by chunk.

Why a module of its own: this is where prefill spends its time, and where the ordering rules
live that keep KV intact: a room's pages are allocated with a deadline, each chunk is computed on
a compute thread (a CUDA stream of its own on GPU) so the event loop keeps answering heartbeats,
chunk n+1 is computed while chunk n is on the wire (at most CHUNKS_IN_FLIGHT_PER_ROOM at once),
and every chunk leaves a fence that the transfer thread waits on before NIXL reads the pages.
The last chunk also yields the first token and the room's KV checksum; the room then enters the
inflight queue, which is when the inflight watchdog's clock starts (a long prefill is legal).
What happens to a chunk once computed is `shards` (the wire side).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from pdworker import integrity, limits
from pdworker.contract import KVMeta, KVPoll, encode_notification
from pdworker.ordering import Fence
from pdworker.prefill.shards import Shards
from pdworker.prefill.state import ChunkJob, PrefillState, RoomWork

log = logging.getLogger(__name__)
mono = time.monotonic


class Forward:
    def __init__(self, state: PrefillState, shards: Shards) -> None:
        self.s = state
        self.shards = shards
        self.slots = asyncio.Semaphore(state.cfg.max_running)  # forwards running at once

    def start(self, room: int) -> None:
        """Run the room's forward pass (its decode destination is bound)."""
        self.s.spawn(self.run(room))

    async def run(self, room: int) -> None:
        s, cfg = self.s, self.s.cfg
        work = s.work[room]
        loop = asyncio.get_running_loop()
        computing: asyncio.Future[Any] | None = None
        try:
            async with self.slots:
                entry = s.table.get(room)
                if entry is None or entry.status == KVPoll.Failed:
                    return
                npages = cfg.model.pages_for(len(work.ids))
                local = s.pool.pages.alloc(room, npages)
                deadline = mono() + cfg.transfer_timeout
                while local is None:
                    if mono() > deadline or s.table.status(room) in (None, KVPoll.Failed):
                        s.table.fail(room, "transfer_error", mono(), "prefill KV pool exhausted")
                        return
                    await asyncio.sleep(0.01)
                    local = s.pool.pages.alloc(room, npages)
                with s.lock:
                    binding = s.bindings.get(room)
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
                    if not s.legacy and s.table.status(room) in (None, KVPoll.Failed):
                        return
                    if cfg.prefill_chunk_ms:
                        await asyncio.sleep(cfg.prefill_chunk_ms / 1000)  # a real model's forward
                    # Chunk n+1 is computed while chunk n's WRITE is in flight; at most
                    # CHUNKS_IN_FLIGHT_PER_ROOM of a room's chunks wait for or are on the wire.
                    if not await self.chunk_slot(room, work):
                        s.table.fail(room, "transfer_error", mono(), "earlier chunks stalled")
                        return  # a no-op fail if the room had failed already
                    last = index == len(chunks) - 1
                    ids = work.ids[index * span : (index + 1) * span]
                    # Forward, page scatter and the KV fingerprint run on a compute thread (a CUDA
                    # stream of its own on GPU): the event loop keeps answering heartbeats.
                    computing = loop.run_in_executor(
                        s.compute,
                        self.compute_chunk,
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
                        s.table.set_phase(room, "inflight", mono())
                    s.table.update(room, KVPoll.Transferring, mono())
                    self.shards.enqueue(job, work)
        except Exception as exc:  # a crashed forward must still end the room, with a reason
            log.exception("forward pass of room %d crashed", room)
            s.table.fail(room, "transfer_error", mono(), f"forward pass crashed: {exc!r}")
        finally:
            if computing is not None and not computing.done():
                # Cancelled while a compute thread still writes our pages: the pages stay ours
                # until it has finished.
                computing.add_done_callback(lambda _: self._finished(work))
            else:
                self._finished(work)

    def _finished(self, work: RoomWork) -> None:
        work.forward_done = True
        self.s.wake.set()

    def compute_chunk(
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
        s = self.s
        began = time.perf_counter()
        try:
            last_hidden = s.model.prefill_into(s.pool, pages, ids)
            result = None
            if room is not None:
                room_pages, earlier = room
                for fence in earlier:  # earlier chunks ran on other threads' streams
                    fence.wait()
                spec = integrity.plan(s.cfg.kv_verify, len(room_pages))
                result = {
                    "first_token": s.model.first_token(last_hidden),
                    "kv_checksum": integrity.checksum(s.pool.tensor, room_pages, spec),
                }
            fence = s.ordering.fence()
        except BaseException:
            with contextlib.suppress(Exception):  # a broken device: nothing more will run
                s.ordering.sync()
            raise
        if work is not None:
            with s.lock:
                work.fences.append(fence)
        return fence, result, time.perf_counter() - began

    async def chunk_slot(self, room: int, work: RoomWork) -> bool:
        """Wait until the room has a chunk slot free: True, or False at the transfer deadline or
        once the fixed worker's room failed. Woken by every chunk that ends (no polling)."""
        bound = limits.CHUNKS_IN_FLIGHT_PER_ROOM
        deadline = mono() + self.s.cfg.transfer_timeout
        while work.pending + work.writing >= bound:
            if not self.s.legacy and self.s.table.status(room) in (None, KVPoll.Failed):
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
