"""Admission: the prefill side of `POST /generate`, and binding a room to decode's pages.

Why a module of its own: this is where a request becomes a room, and where nothing is allowed to
happen before the input is checked. A body is validated completely, a full or stopping worker
answers before any state exists, and a duplicate room id is refused without counting it as a
failure. Decode may register its pages for a room before prefill sees the request (the pending
binding is picked up here), or after (`bind`, called by the decode links): either way the first
decode to bind a room owns it, the page count and range are checked against the room and the
peer's pool, and only then does the forward pass start. The request waits for the settle loop's
answer; a client that goes away aborts its room.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from aiohttp import web

from pdworker.config import parse_ids
from pdworker.contract import KVPoll
from pdworker.prefill.forward import Forward
from pdworker.prefill.state import Binding, PrefillState, RoomWork
from pdworker.rooms import RoomRejected
from pdworker.server import BadRequest, client_error, error, parse_room, read_json

mono = time.monotonic


class Admission:
    def __init__(self, state: PrefillState, forward: Forward) -> None:
        self.s = state
        self.forward = forward

    async def handle_generate(self, request: web.Request) -> web.StreamResponse:
        s = self.s
        try:
            body = await read_json(request)
            if not isinstance(body, dict):
                raise BadRequest("body must be a JSON object")
            room = parse_room(body.get("bootstrap_room"))
            ids = parse_ids(body.get("input_ids"))
        except BadRequest as exc:
            return client_error(exc)
        if s.stopping:
            return error(503, "prefill is shutting down", reason="aborted")
        if len(s.table) >= s.cfg.max_rooms:
            return error(429, f"prefill holds {s.cfg.max_rooms} rooms; retry later")
        now = mono()
        try:
            s.table.create(room, "bootstrap", now)
        except RoomRejected as exc:
            if exc.reason != "duplicate":
                s.metrics.failed.labels(reason=exc.reason).inc()
            return error(409 if exc.reason == "duplicate" else 500, exc.detail, reason=exc.reason)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        with s.lock:
            s.work[room] = RoomWork(ids=ids)
            early = s.pending_bindings.pop(room, None)
        s.waiters[room] = future
        if early is not None:
            problem = self.bind(room, early)
            if problem:
                s.table.fail(room, "transfer_error", now, problem)
        try:
            result = await future
        except asyncio.CancelledError:
            self.abort(room, "client disconnected")
            raise
        finally:
            s.waiters.pop(room, None)
        return web.json_response(result, status=200 if result["ok"] else 500)

    def abort(self, room: int, detail: str) -> None:
        s = self.s
        if not s.table.fail(room, "aborted", mono(), detail) and s.table.get(room) is None:
            s.table.tombstone(room, "aborted", detail)

    def bind(self, room: int, binding: Binding) -> str | None:
        """Attach decode's destination pages to a room and start its forward pass; what is
        wrong with the binding, or None."""
        s = self.s
        with s.lock:
            work = s.work.get(room)
            peer = s.peers.get(binding.agent)
            if work is None or peer is None or peer.dead:
                return "decode peer is gone"
            if room in s.bindings:
                return "room is already bound"  # first bind wins, never re-bound
            needed = s.cfg.model.pages_for(len(work.ids))
            if len(binding.pages) != needed:
                return f"decode sent {len(binding.pages)} pages, room needs {needed}"
            if any(not 0 <= p < peer.num_pages for p in binding.pages):
                return "decode page index out of range"
            s.bindings[room] = binding
            work.forward_started = True
        s.table.bind(room, peer.peer)
        s.table.update(room, KVPoll.WaitingForInput, mono())
        s.table.set_phase(room, "forward", mono())
        self.forward.start(room)
        return None
