"""The decode role: pre-allocate KV pages, hand prefill their addresses, wait for KV, decode.

Mirrors SGLang's decode (prealloc queue -> transfer queue -> running) with the fixes: the wait
for KV has a deadline and notifications are drained before it is checked, prefill-pushed failures
end a room at once, an abort is sent to prefill and the pages are freed only after prefill
acknowledges (or cannot be reached), and a prefill that stops answering heartbeats or restarts
fails the rooms bound to it. `decode-stall` wedges this process on purpose: it stops consuming
notifications and decoding, while /healthz keeps answering 200, as a wedged engine does.

This module is the request path (admission, the handshake through `prefill_link`, waiting for
the KV, checking it, decoding, cleaning up); what prefill's notifications do to a room is
`inbox`, and the per-room record both share is `work`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from typing import Any

import torch
from aiohttp import web

from pdworker import integrity, limits
from pdworker.allow import PrefillAllow, parse_allow
from pdworker.compute import compute_executor
from pdworker.config import WorkerConfig, parse_ids, parse_positive_int
from pdworker.contract import KVPoll
from pdworker.decode.inbox import Inbox
from pdworker.decode.prefill_link import PeerError, PrefillLinks, endpoint
from pdworker.decode.work import DecodeWork
from pdworker.discovery import PodPorts
from pdworker.handshake import Refused, format_address, split_address
from pdworker.metrics import WorkerMetrics
from pdworker.model import KVPool, TinyModel
from pdworker.ordering import Ordering
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
from pdworker.transfer import Transport

log = logging.getLogger(__name__)
mono = time.monotonic
BOOTSTRAP_PORT_NAME = "bootstrap"  # the container port prefill pods declare (operator's render)
NOT_ALLOWED = "bootstrap endpoint not allowed: not a prefill of this decode's deployment"
NOTHING_ALLOWED = (
    "this decode dials no prefill: it was given neither --prefill-allow nor --prefill-selector"
)


class DecodeWorker:
    def __init__(
        self, cfg: WorkerConfig, model: TinyModel, pool: KVPool, transport: Transport
    ) -> None:
        self.cfg = cfg
        self.model = model
        self.pool = pool
        self.transport = transport
        deadlines: dict[str, float | None] = {
            "prealloc": cfg.waiting_timeout,
            "transfer": cfg.waiting_timeout,
        }
        self.table = RoomTable("decode", deadlines=deadlines, legacy=cfg.faults.legacy_status_race)
        self.metrics = WorkerMetrics("decode", cfg.incarnation, self.table, pool.pages)
        self.allow = PrefillAllow(parse_allow(cfg.prefill_allow))
        self.links = PrefillLinks(cfg, transport, pool, self._rooms_lost)
        self.links.in_use = lambda address: any(w.link == address for w in self.work.values())
        self.work: dict[int, DecodeWork] = {}
        self.tasks: set[asyncio.Task[Any]] = set()
        self.unstalled = asyncio.Event()
        self.unstalled.set()
        self.inbox = Inbox(
            cfg, transport, self.table, work=self.work, fail=self._fail, unstalled=self.unstalled
        )
        self.requests_seen = 0
        self.stopping = False
        self.started = False
        self.ordering = Ordering(pool.device)
        self.compute = compute_executor(cfg.compute_threads, pool.device)

    # -- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        if self.cfg.prefill_selector:  # the deployment's prefill pods (allow.py)
            pods = PodPorts(self.cfg.namespace, self.cfg.prefill_selector, BOOTSTRAP_PORT_NAME)
            await asyncio.to_thread(pods.refresh)
            pods.start()
            self.allow.pods = pods
        if not self.allow.configured:
            log.warning(
                "neither --prefill-allow nor --prefill-selector: this decode dials no prefill"
            )
        await self.links.start()
        self._spawn(self.inbox.pump_loop())
        self._spawn(self.inbox.watchdog_loop())
        self._spawn(self.links.heartbeat_loop())
        self.started = True

    async def stop(self) -> None:
        self.stopping = True
        now = mono()
        for room in self.table.select(now):
            self._fail(room, "aborted", "decode shutting down")
        await wait_until(
            lambda: not self.work or not self.unstalled.is_set(), self.cfg.abort_ack_timeout
        )
        for task in self.tasks:
            task.cancel()
        await self.links.close()
        if self.allow.pods is not None:
            self.allow.pods.close()
        self.compute.shutdown(wait=False, cancel_futures=True)
        self.transport.close()

    def ready(self) -> bool:
        """Started, not stopping, and (with --prefill-selector) the prefill pods listed once."""
        pods = self.allow.pods
        return self.started and not self.stopping and (pods is None or pods.listed)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def stall(self, why: str) -> None:
        if self.unstalled.is_set():
            log.warning("decode-stall fault triggered (%s): this decode stops making progress", why)
            self.unstalled.clear()

    # -- request path --------------------------------------------------------------------
    async def handle_generate(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await read_json(request)
            if not isinstance(body, dict):
                raise BadRequest("body must be a JSON object")
            room = parse_room(body.get("bootstrap_room"))
            ids = parse_ids(body.get("input_ids"))
            max_new = parse_positive_int(body, "max_new_tokens", 16, limits.MAX_NEW_TOKENS)
            ip, port = endpoint(body.get("bootstrap_host"), body.get("bootstrap_port"))
        except BadRequest as exc:
            return client_error(exc)
        # Only prefills of this deployment: allowed before any connection (allow.py) and, before
        # anything of ours is sent, proven to hold the bootstrap key (prefill_link).
        link = format_address(ip, port)
        if not await self.allow.admit(ip, port):
            self.metrics.endpoints_refused.labels(reason="not_allowed").inc()
            log.info("refused to dial bootstrap endpoint %s: not allowed", link)
            why = NOT_ALLOWED if self.allow.configured else NOTHING_ALLOWED
            return error(403, why, reason="aborted")
        try:
            self.links.admit(link)
        except Refused as exc:
            return error(exc.status, exc.message, reason="aborted")
        if self.stopping:
            return error(503, "decode is shutting down", reason="aborted")
        if self.cfg.bootstrap_token.current() is None:
            return error(503, "decode has no bootstrap token configured", reason="aborted")
        if len(self.table) >= self.cfg.max_rooms:
            return error(429, f"decode holds {self.cfg.max_rooms} rooms; retry later")
        self.requests_seen += 1
        after = self.cfg.faults.decode_stall_after
        if self.cfg.faults.decode_stall and after is not None and self.requests_seen > after:
            self.stall(f"after {after} requests")
        try:
            self.table.create(room, "prealloc", mono())
        except RoomRejected as exc:
            return error(409, exc.detail, reason="aborted")
        work = DecodeWork(ids, max_new, link, asyncio.get_running_loop().create_future())
        self.work[room] = work
        try:
            result = await self._serve(room, work)
        except asyncio.CancelledError:
            self._fail(room, "aborted", "client disconnected")
            raise
        except Exception as exc:  # never leave a room behind without a reason
            log.exception("room %d crashed", room)
            self._fail(room, "transfer_error", f"decode crashed: {exc!r}")
            result = self._failure(room)
        finally:
            self._spawn(self._cleanup(room, work))
        status = 200 if result["ok"] else 403 if work.untrusted else 500
        return web.json_response(result, status=status)

    def _fail(self, room: int, reason: str, detail: str) -> bool:
        if not self.table.fail(room, reason, mono(), detail):
            return False
        work = self.work.get(room)
        if work is not None and not work.done.done():
            work.done.set_result(None)
        return True

    def _failure(self, room: int) -> dict[str, Any]:
        entry = self.table.get(room)
        reason = entry.reason if entry and entry.reason else "aborted"
        return {"ok": False, "room": room, "reason": reason, "error": entry.detail if entry else ""}

    async def _serve(self, room: int, work: DecodeWork) -> dict[str, Any]:
        # decode-stall does not block admission: rooms register with prefill, the KV lands, and
        # then nothing consumes it, so they pile up in the transfer queue (the wedge signature).
        try:
            link = await self.links.ensure(work.link)
        except PeerError as exc:
            work.untrusted = exc.untrusted
            self.metrics.endpoints_refused.labels(reason=exc.kind).inc()
            self._fail(room, exc.reason, exc.detail)
            return self._failure(room)
        work.agent = link.agent
        ip = split_address(link.address)[0]
        self.table.bind(room, Peer(link.pod, link.address, link.incarnation, ip))
        needed = self.cfg.model.pages_for(len(work.ids))
        pages = self.pool.pages.alloc(room, needed)
        while pages is None:  # the prealloc deadline (watchdog) bounds this wait
            if self.table.status(room) in (None, KVPoll.Failed):
                return self._failure(room)
            await asyncio.sleep(0.01)
            pages = self.pool.pages.alloc(room, needed)
        work.pages = pages
        if self.table.status(room) in (None, KVPoll.Failed):
            return self._failure(room)
        work.registered = True
        try:
            await self.links.register_room(link, room, pages)
        except PeerError as exc:
            work.prefill_knows = exc.reason != "transfer_error"
            self._fail(room, exc.reason, exc.detail)
            return self._failure(room)
        self.table.set_phase(room, "transfer", mono())
        self.table.update(room, KVPoll.WaitingForInput, mono())
        work.transfer_started = mono()
        await work.done
        if self.table.status(room) != KVPoll.Transferring or work.n_chunks is None:
            self._fail(room, "transfer_error", "transfer ended without data")
            return self._failure(room)
        loop = asyncio.get_running_loop()
        # The KV has landed (every chunk's notification and the meta arrived): verify it and
        # copy out what decoding needs on a compute thread, never on the event loop.
        work.reading = self.compute.submit(self._verify_and_read, work)
        ok, kv = await asyncio.wrap_future(work.reading)
        if not ok:
            self.metrics.checksum_mismatch.inc()
            self._fail(room, "transfer_error", "KV checksum mismatch")
            return self._failure(room)
        self.table.update(room, KVPoll.Success, mono())
        self.metrics.kv_seconds.observe(mono() - work.transfer_started)
        self.table.set_phase(room, "running", mono())
        tokens = [work.first_token]
        self.metrics.generated_tokens.inc()
        for _ in range(work.max_new - 1):
            await self.unstalled.wait()
            if self.cfg.decode_token_ms:
                await asyncio.sleep(self.cfg.decode_token_ms / 1000)  # a real model's step
            tokens.append(
                await loop.run_in_executor(self.compute, self.model.decode_step, kv, tokens[-1])
            )
            self.metrics.generated_tokens.inc()
        work.finished = True
        self.metrics.completed.labels(role="decode").inc()
        return {
            "ok": True,
            "room": room,
            "output_ids": tokens,
            "kv_checksum": work.checksum,
            "kv_bytes": len(pages) * self.cfg.model.page_bytes,
            "prompt_tokens": len(work.ids),
        }

    def _verify_and_read(self, work: DecodeWork) -> tuple[bool, torch.Tensor]:
        """(compute thread) check the landed KV against prefill's fingerprint; return the last
        layer's KV (a copy, so the pages can be freed while decoding goes on)."""
        pages = work.pages
        try:
            corrupt = self.cfg.faults.corrupt_kv
            if corrupt and random.random() < corrupt:
                self._flip_one_byte(pages)
            ok = True
            spec = integrity.decode_spec(work.checksum)
            if self.cfg.kv_verify != integrity.OFF and spec is not None:
                ok = integrity.checksum(self.pool.tensor, pages, spec) == work.checksum
            kv = self.pool.read_tokens(pages, len(work.ids), layers=slice(-1, None))
        except BaseException:
            with contextlib.suppress(Exception):  # kernels launched before the error finish
                self.ordering.sync()
            raise
        self.ordering.sync()  # the copy is done before the pages can be freed and rewritten
        return ok, kv

    def _flip_one_byte(self, pages: list[int]) -> None:
        """The corrupt-kv fault: one byte of one landed page changes, as a bad transfer would."""
        page = self.pool.tensor[random.choice(pages)].view(-1).view(torch.uint8)
        at = random.randrange(page.numel())
        page[at] ^= 1 << random.randrange(8)

    async def _cleanup(self, room: int, work: DecodeWork) -> None:
        await self.unstalled.wait()  # a wedged decode does not clean up either
        entry = self.table.get(room)
        if entry is not None and entry.status == KVPoll.Failed:
            if work.registered and not work.prefill_knows:
                await self.links.send_abort(work.link, room)
            self.metrics.failed.labels(reason=entry.reason or "aborted").inc()
        elif not work.finished:
            self.metrics.failed.labels(reason="aborted").inc()  # cancelled while decoding
        if not await self._reading_finished(work):
            # Still running after the deadline (a hung device): the pages go back only when it
            # returns. Until then a new room with this id cannot take pages (alloc refuses).
            log.warning("room %d: KV read still running at cleanup; pages freed after it", room)
            reading = work.reading
            assert reading is not None
            # (on the compute thread that finishes it; PagePool is thread-safe)
            reading.add_done_callback(lambda _: self.pool.pages.free(room))
        else:
            self.pool.pages.free(room)
        self.table.clear(room)
        self.work.pop(room, None)

    async def _reading_finished(self, work: DecodeWork) -> bool:
        """Wait (up to the transfer deadline) for a compute call still reading the room's pages,
        as after a cancelled request; its outcome does not matter here. True once none runs."""
        reading = work.reading
        if reading is None or reading.done():
            return True
        loop = asyncio.get_running_loop()
        ended = asyncio.Event()
        reading.add_done_callback(lambda _: loop.call_soon_threadsafe(ended.set))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(ended.wait(), self.cfg.transfer_timeout)
        return reading.done()

    def _rooms_lost(self, address: str, why: str) -> None:
        """A prefill is gone (or forgot us): fail every room bound to it, no ABORT needed."""
        for room, work in list(self.work.items()):
            if work.link == address and work.registered:
                work.prefill_knows = True
                self._fail(room, "peer_lost", f"prefill {address} lost: {why}")

    # -- admin ---------------------------------------------------------------------------
    def list_rooms(self) -> list[dict[str, Any]]:
        now = mono()
        return [r.as_dict(now) for r in self.table.snapshot()]

    async def fail_rooms(self, selector: FailSelector) -> list[int]:
        rooms = self.table.select(
            mono(),
            rooms=selector.rooms,
            older_than=selector.older_than_seconds,
            peer_incarnation=selector.peer_incarnation,
        )
        return [r for r in rooms if self._fail(r, "admin", "failed by the admin API")]

    async def handle_stall(self, _: web.Request) -> web.StreamResponse:
        if not self.cfg.faults.decode_stall:
            return error(409, "the decode-stall fault is not enabled (--fault decode-stall)")
        self.stall("admin call")
        return web.json_response({"stalled": True})
