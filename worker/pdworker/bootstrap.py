"""Prefill's bootstrap server: the HTTP endpoints decode uses for the handshake.

Decode registers itself once per incarnation (NIXL agent metadata plus its KV pool geometry as
plain numbers: nothing is unpickled, descriptors are built here), then registers each room's
destination pages, heart-beats, and sends ABORTs, which are acknowledged only once no WRITE into
its pages is in flight. A new incarnation from the same pod replaces the old peer and fails the
rooms bound to it.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from pdworker.prefill import Binding, DecodePeer, PrefillWorker
from pdworker.rooms import Peer
from pdworker.server import BadRequest, error, parse_room, read_json, wait_until
from pdworker.transfer import TransferError

log = logging.getLogger(__name__)
mono = time.monotonic


class BootstrapServer:
    def __init__(self, worker: PrefillWorker) -> None:
        self.w = worker

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/bootstrap/info", self._info)
        app.router.add_get("/health", self._health)
        app.router.add_post("/bootstrap/peer", self._wrap(self._register_peer))
        app.router.add_post("/bootstrap/room", self._wrap(self._register_room))
        app.router.add_post("/bootstrap/abort", self._wrap(self._abort_from_decode))
        app.router.add_post("/bootstrap/heartbeat", self._wrap(self._heartbeat))
        return app

    def _wrap(
        self, handler: Callable[[dict[str, Any]], Awaitable[web.StreamResponse]]
    ) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def wrapped(request: web.Request) -> web.StreamResponse:
            try:
                body = await read_json(request)
                if not isinstance(body, dict):
                    raise BadRequest("body must be a JSON object")
                return await handler(body)
            except BadRequest as exc:
                return error(400, str(exc))

        return wrapped

    async def _health(self, _: web.Request) -> web.Response:
        return web.json_response({"ok": True, "incarnation": self.w.cfg.incarnation})

    async def _info(self, _: web.Request) -> web.Response:
        return web.json_response(
            {
                "incarnation": self.w.cfg.incarnation,
                "agent": self.w.transport.name,
                "pod": self.w.cfg.pod,
                "layout": self.w.cfg.model.layout(),
            }
        )

    async def _register_peer(self, body: dict[str, Any]) -> web.Response:
        try:
            agent = str(body["agent"])
            peer = Peer(str(body["pod"]), str(body["address"]), str(body["incarnation"]))
            metadata = base64.b64decode(body["metadata"], validate=True)
            pool = body["pool"]
            base, page_bytes, num_pages = (
                int(pool["base_addr"]),
                int(pool["page_bytes"]),
                int(pool["num_pages"]),
            )
            device_id, mem_type = int(pool["device_id"]), str(pool["mem_type"])
            layout = body["layout"]
        except (KeyError, TypeError, ValueError) as exc:
            raise BadRequest(f"bad peer registration: {exc}") from exc
        if layout != self.w.cfg.model.layout() or page_bytes != self.w.cfg.model.page_bytes:
            return error(400, "KV layout mismatch", ours=self.w.cfg.model.layout(), theirs=layout)
        if mem_type not in ("DRAM", "VRAM") or num_pages <= 0 or base <= 0:
            raise BadRequest("bad pool geometry")
        if agent in self.w.peers and not self.w.peers[agent].dead:
            self.w.peers[agent].last_seen = mono()
            return web.json_response({"registered": agent, "incarnation": self.w.cfg.incarnation})
        for other, known in list(self.w.peers.items()):
            if other != agent and known.peer.pod == peer.pod and not known.dead:
                self.w._peer_lost(other, f"replaced by new incarnation {peer.incarnation}")
        descs = [(base + i * page_bytes, page_bytes, device_id) for i in range(num_pages)]
        try:
            await asyncio.to_thread(self.w.transport.add_peer, agent, metadata, descs, mem_type)
        except TransferError as exc:
            raise BadRequest(str(exc)) from exc
        except Exception as exc:
            raise BadRequest(f"cannot load peer metadata: {type(exc).__name__}") from exc
        with self.w.lock:
            self.w.peers[agent] = DecodePeer(agent, peer, num_pages, mono())
        log.info("registered decode peer %s (%s)", agent, peer.address)
        return web.json_response({"registered": agent, "incarnation": self.w.cfg.incarnation})

    async def _register_room(self, body: dict[str, Any]) -> web.Response:
        room = parse_room(body.get("room"))
        agent = str(body.get("agent", ""))
        pages = body.get("pages")
        if not isinstance(pages, list) or not all(
            isinstance(p, int) and not isinstance(p, bool) for p in pages
        ):
            raise BadRequest("pages must be a list of page indices")
        peer = self.w.peers.get(agent)
        if peer is None or peer.dead:
            return error(409, "unknown decode peer; register first", reason="peer_lost")
        peer.last_seen = mono()
        binding = Binding(agent, pages, mono())
        entry = self.w.table.get(room)
        if entry is None:
            with self.w.lock:
                known = room in self.w.work
                if not known:
                    self.w.pending_bindings[room] = binding
            if not known:
                return web.json_response({"accepted": "pending"})
            entry = self.w.table.get(room)
        if entry is None or entry.terminal:
            reason = entry.reason if entry and entry.reason else "aborted"
            return error(410, "room already finished", reason=reason)
        if room in self.w.bindings:
            return error(409, "room already registered", reason="aborted")
        problem = self.w._bind(room, binding)
        if problem:
            self.w.table.fail(room, "transfer_error", mono(), problem)
            return error(400, problem, reason="transfer_error")
        return web.json_response({"accepted": "bound"})

    async def _abort_from_decode(self, body: dict[str, Any]) -> web.Response:
        room = parse_room(body.get("room"))
        now = mono()
        with self.w.lock:
            self.w.bindings.pop(room, None)  # no write may start into decode's pages from now on
            self.w.pending_bindings.pop(room, None)
            work = self.w.work.get(room)
            if work is not None:
                work.decode_aborted = True
        if not self.w.table.fail(room, "aborted", now, "aborted by decode") and work is None:
            self.w.table.tombstone(room, "aborted", "aborted by decode before prefill saw it")
        # Writes into decode's pages are counted by transfer threads; poll them with a deadline.
        drained = work is None or await wait_until(
            lambda: not work.writing, self.w.cfg.transfer_timeout + 1, interval=0.002
        )
        return web.json_response({"acked": drained, "room": room})

    async def _heartbeat(self, body: dict[str, Any]) -> web.Response:
        peer = self.w.peers.get(str(body.get("agent", "")))
        known = peer is not None and not peer.dead
        if peer is not None and known:
            peer.last_seen = mono()
        return web.json_response({"incarnation": self.w.cfg.incarnation, "known": known})
