"""Decode's inbox: prefill's notifications (chunks landed, the room's meta, failures) and the
deadlines judged after them.

Why a module of its own: this is the one place NIXL's word reaches decode's rooms, and it must
not trust it: a malformed message is ignored, a notification for a room that is not this agent's
(or no longer waits) never re-creates or touches it, and a room never counts more chunks than it
has pages. Notifications are drained before deadlines are judged (SGLang PR #32267: a room whose
last chunk landed must not fail on a deadline it met), one bad message never loses the rest of
its batch, and both loops survive an error in one round. The `decode-stall` fault stops both, as
a wedged engine does; `drop-notifications=P` drops messages on purpose.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable

from pdworker.config import WorkerConfig
from pdworker.contract import KVChunk, KVFail, KVMeta, KVPoll, decode_notification
from pdworker.decode.work import DecodeWork
from pdworker.rooms import RoomTable
from pdworker.transfer import Transport

log = logging.getLogger(__name__)
mono = time.monotonic


class Inbox:
    def __init__(
        self,
        cfg: WorkerConfig,
        transport: Transport,
        table: RoomTable,
        *,
        work: dict[int, DecodeWork],
        fail: Callable[[int, str, str], bool],
        unstalled: asyncio.Event,
    ) -> None:
        self.cfg = cfg
        self.transport = transport
        self.table = table
        self.work = work
        self.fail = fail  # (room, reason, detail): ends the room and wakes its request
        self.unstalled = unstalled

    async def pump_loop(self) -> None:
        while True:
            if self.unstalled.is_set():
                try:
                    self.pump()
                except Exception:
                    log.exception("notification pump")
            busy = self.table.count("transfer") > 0
            await asyncio.sleep(self.cfg.poll_interval if busy else 0.02)

    def pump(self) -> None:
        drop = self.cfg.faults.drop_notifications
        for agent, messages in self.transport.poll_notifs().items():
            for raw in messages:
                if drop and random.random() < drop:
                    continue
                try:
                    self.on_notif(agent, raw)
                except Exception:  # the batch was handed over: one bad message loses no other
                    log.exception("notification from %s", agent)

    def on_notif(self, agent: str, raw: bytes) -> None:
        note = decode_notification(raw)
        if note is None:
            return  # malformed: ignored
        room = note.room
        work = self.work.get(room)
        if work is None or work.agent != agent or work.done.done():
            return  # late or foreign notification: ignored, never re-creates a room
        if isinstance(note, KVChunk):
            if len(work.chunks) >= len(work.pages):
                return  # more chunks than pages: not from an honest prefill
            work.chunks.add(note.index)
            self.table.update(room, KVPoll.Transferring, mono())
        elif isinstance(note, KVMeta):
            work.n_chunks, work.first_token, work.checksum = (
                note.chunks,
                note.first_token,
                note.checksum,
            )
        elif isinstance(note, KVFail):
            work.prefill_knows = True
            self.fail(room, note.reason, f"failed by prefill ({note.reason})")
            return
        complete = work.n_chunks is not None and len(work.chunks) >= work.n_chunks
        if complete and not work.done.done():
            work.done.set_result(None)

    async def watchdog_loop(self) -> None:
        while True:
            await asyncio.sleep(max(self.cfg.poll_interval, 0.01))
            if not self.unstalled.is_set():
                continue
            try:
                self.pump()  # drain first, then judge deadlines (SGLang PR #32267)
            except Exception:  # the deadlines below are judged anyway: this loop never ends
                log.exception("notification pump (watchdog)")
            try:
                for entry in self.table.expire(mono()):
                    work = self.work.get(entry.room)
                    if work is not None and not work.done.done():
                        work.done.set_result(None)
            except Exception:
                log.exception("decode watchdog")
