"""The settle loop: deadlines, peer silence, and ending rooms once nothing touches their pages.

Why a module of its own: a room's end is the one moment where every other part must be done
with it. A terminal room (Success or Failed) is settled only when no chunk of it is queued or on
the wire, its forward pass has returned and every fence of its kernels has passed; then its pages
go back to the pool, the metrics count it, a failure is pushed to decode (SGLang's NIXL backend
never did) unless decode aborted it itself, and the waiting request gets its answer. The same
loop judges the room deadlines (bootstrap, inflight watchdog) and decode peers' heartbeats, so
no wait in the prefill is without a deadline. It polls fast only while rooms are live; transfer
completions wake it at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from pdworker.contract import KVFail, KVPoll, encode_notification
from pdworker.prefill.links import DecodeLinks
from pdworker.prefill.state import PrefillState, RoomWork
from pdworker.transfer import TransferError

IDLE_POLL_S = 0.05
log = logging.getLogger(__name__)
mono = time.monotonic


class Settler:
    def __init__(self, state: PrefillState, links: DecodeLinks) -> None:
        self.s = state
        self.links = links

    async def loop(self) -> None:
        s = self.s
        while True:
            s.wake.clear()  # before the pass: a completion during it wakes the next one
            try:
                now = mono()
                s.table.expire(now)
                self.links.check(now)
                self.settle(now)
            except Exception:
                log.exception("settle loop")
            # Poll fast only while rooms are live: an idle worker must not burn a core's share.
            # Transfer completions wake this loop at once (PrefillState.wake).
            pause = s.cfg.poll_interval if len(s.table) else IDLE_POLL_S
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(s.wake.wait(), pause)

    def settle(self, now: float) -> None:
        s = self.s
        for entry in s.table.snapshot():
            if not entry.terminal:
                continue
            room = entry.room
            with s.lock:
                work = s.work.get(room)
                if work is not None and (work.pending or work.writing):
                    continue  # chunk jobs still hold our pages or decode's
                if work is not None and work.forward_started and not work.forward_done:
                    continue  # the forward pass still writes into our pages
                if work is not None and not _fences_passed(work):
                    continue  # kernels of the room still write its pages: settled on a later
                    # pass (the loop polls every poll_interval while the room is in the table)
                binding = s.bindings.pop(room, None)
                s.work.pop(room, None)
                peer = s.peers.get(binding.agent) if binding else None
            s.table.clear(room)
            s.pool.pages.free(room)
            if entry.status == KVPoll.Success and work is not None:
                s.metrics.completed.labels(role="prefill").inc()
                s.metrics.kv_seconds.observe(work.wire_seconds)
                s.metrics.forward_seconds.observe(work.forward_seconds)
                result = {"ok": True, "room": room, "kv_bytes": work.bytes, **work.result}
            else:
                reason = entry.reason or "aborted"
                s.metrics.failed.labels(reason=reason).inc()
                result = {"ok": False, "room": room, "reason": reason, "error": entry.detail}
                if binding and peer and not peer.dead and not (work and work.decode_aborted):
                    try:  # push the failure to decode (SGLang's NIXL backend never did)
                        s.transport.notify(binding.agent, encode_notification(KVFail(room, reason)))
                    except TransferError as exc:
                        log.info("could not push failure of room %d: %s", room, exc)
            future = s.waiters.get(room)
            if future is not None and not future.done():
                future.set_result(result)
        cutoff = now - s.cfg.bootstrap_timeout
        with s.lock:
            for room in [r for r, b in s.pending_bindings.items() if b.at < cutoff]:
                del s.pending_bindings[room]


def _fences_passed(work: RoomWork) -> bool:
    """(under PrefillState.lock) whether the device finished every chunk of the room (a
    non-blocking query; passed fences are dropped so a room is not queried twice for them)."""
    while work.fences:
        try:
            if not work.fences[-1].passed():
                return False
        except Exception:  # a device error: nothing launched on it runs any more
            log.exception("querying a KV fence failed; treating it as passed")
        work.fences.pop()
    return True
