"""Prefill's bootstrap server: the HTTP endpoints decode uses for the handshake.

A thin HTTP layer over public `PrefillWorker` methods. What it adds is the trust boundary: every
POST carries the deployment's bootstrap key (`Authorization: Bearer`, compared in constant time; no
key configured means every POST is refused), every body is read under its endpoint's cap and
checked completely (`handshake`) before the worker does anything with it, and a peer is bound to
the TCP address it registered from, so only that address may use its agent name. `GET
/bootstrap/info?nonce=N` proves to decode that this endpoint holds the key, bound to the address
the question reached. The key file is read again when it is rotated (`secret_file`): the key it
replaced is accepted, and proven, for the grace that module states. Client errors are 4xx with a
reason; a bug here is a 500 that is logged, never dressed up as a client error.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from pdworker import handshake as hs
from pdworker import limits
from pdworker.handshake import (
    AUTH_SCHEME,
    Refused,
    format_address,
    info_proof,
    parse_agent,
    parse_ip,
    parse_pages,
    parse_peer,
)
from pdworker.prefill import PrefillWorker
from pdworker.secret_file import Secret
from pdworker.server import (
    BadRequest,
    client_error,
    error,
    parse_room,
    presented_token,
    read_json,
)

log = logging.getLogger(__name__)
Handler = Callable[[dict[str, Any], str], Awaitable[web.StreamResponse]]
MAX_NONCE_CHARS = 128


def caller_ip(request: web.Request) -> str:
    """The TCP peer's IP, canonical (an IPv4-mapped IPv6 address as plain IPv4)."""
    return parse_ip(request.remote or "0.0.0.0")


class BootstrapServer:
    def __init__(self, worker: PrefillWorker, token: Secret | str | None) -> None:
        self.w = worker
        self.token = Secret.of(token, "bootstrap")

    def app(self) -> web.Application:
        app = web.Application(client_max_size=limits.BOOTSTRAP_ROOM_BODY_BYTES)
        app.router.add_get(hs.INFO_PATH, self._info)
        app.router.add_get("/health", self._health)
        routes: list[tuple[str, Handler, int]] = [
            (hs.PEER_PATH, self._register_peer, limits.BOOTSTRAP_PEER_BODY_BYTES),
            (hs.ROOM_PATH, self._register_room, limits.BOOTSTRAP_ROOM_BODY_BYTES),
            (hs.ABORT_PATH, self._abort_from_decode, limits.BOOTSTRAP_SMALL_BODY_BYTES),
            (hs.HEARTBEAT_PATH, self._heartbeat, limits.BOOTSTRAP_SMALL_BODY_BYTES),
        ]
        for path, handler, cap in routes:
            app.router.add_post(path, self._guard(handler, cap))
        if self.token.current() is None:
            log.warning("no bootstrap token configured: the bootstrap server refuses every peer")
        return app

    def _guard(self, handler: Handler, max_bytes: int) -> Callable[[web.Request], Any]:
        async def guarded(request: web.Request) -> web.StreamResponse:
            if not self.token.accepted():
                return error(403, "bootstrap disabled: no bootstrap token configured")
            header = request.headers.get("Authorization", "")
            if self.token.matching(presented_token(header, AUTH_SCHEME)) is None:
                return error(401, "missing or wrong bootstrap token")
            try:
                body = await read_json(request, max_bytes)
                if not isinstance(body, dict):
                    raise BadRequest("body must be a JSON object")
                return await handler(body, caller_ip(request))
            except BadRequest as exc:
                return client_error(exc)
            except Refused as exc:
                extra = {"reason": exc.reason} if exc.reason else {}
                return error(exc.status, exc.message, **extra)

        return guarded

    async def _health(self, _: web.Request) -> web.Response:
        return web.json_response({"ok": True, "incarnation": self.w.cfg.incarnation})

    async def _info(self, request: web.Request) -> web.Response:
        answer: dict[str, Any] = {
            "incarnation": self.w.cfg.incarnation,
            "agent": self.w.transport.name,
            "pod": self.w.cfg.pod,
            "layout": self.w.cfg.model.layout(),
        }
        nonce = request.query.get("nonce", "")
        sock = request.transport.get_extra_info("sockname") if request.transport else None
        keys = self.token.accepted()
        if keys and 0 < len(nonce) <= MAX_NONCE_CHARS and sock:
            # A proof under each key accepted (the current one first): a decode that has not
            # seen a rotated key yet still recognises this prefill.
            reached = format_address(parse_ip(str(sock[0])), int(sock[1]))
            answer["proof"] = info_proof(keys[0], nonce, reached)
            answer["proofs"] = [info_proof(k, nonce, reached) for k in keys]
        return web.json_response(answer)

    async def _register_peer(self, body: dict[str, Any], ip: str) -> web.Response:
        cfg = self.w.cfg
        reg = parse_peer(body, ip, cfg.model.layout(), cfg.model.page_bytes)
        await self.w.register_peer(reg)
        return web.json_response({"registered": reg.agent, "incarnation": cfg.incarnation})

    async def _register_room(self, body: dict[str, Any], ip: str) -> web.Response:
        room = parse_room(body.get("room"))
        agent = parse_agent(body)
        pages = parse_pages(body.get("pages"), limits.MAX_PEER_PAGES)
        return web.json_response({"accepted": self.w.register_room(agent, ip, room, pages)})

    async def _abort_from_decode(self, body: dict[str, Any], ip: str) -> web.Response:
        room = parse_room(body.get("room"))
        drained = await self.w.abort_from_decode(parse_agent(body), ip, room)
        return web.json_response({"acked": drained, "room": room})

    async def _heartbeat(self, body: dict[str, Any], ip: str) -> web.Response:
        known = self.w.heartbeat(parse_agent(body), ip)
        return web.json_response({"incarnation": self.w.cfg.incarnation, "known": known})
