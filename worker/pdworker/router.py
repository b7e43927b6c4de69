"""The router: one POST /generate per client request, dispatched to a prefill and a decode.

Like SGLang's routers it picks a random 63-bit bootstrap room (from `secrets`, so nobody can
predict another request's room) and calls prefill and decode
concurrently (awaiting prefill first deadlocks by construction: prefill waits for decode's
handshake). It returns decode's answer. A client that disconnects cancels both legs, which the
workers see as an abort of the room. A worker that cannot be reached is logged with the details;
the client hears a fixed sentence.
"""

from __future__ import annotations

import asyncio
import logging
import random
import secrets
import time
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web

from pdworker import limits
from pdworker.config import parse_ids, parse_positive_int
from pdworker.contract import FAILURE_REASONS
from pdworker.discovery import Discovery
from pdworker.router_shell import RouterShell
from pdworker.server import BadRequest, client_error, error, read_json

log = logging.getLogger(__name__)
PREFILL_GRACE_S = 5.0


class Router(RouterShell):
    def __init__(
        self, discovery: Discovery, incarnation: str, request_timeout: float = 600.0
    ) -> None:
        super().__init__(discovery, incarnation, request_timeout)
        self._bootstrap_ports: dict[str, int] = {}

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/generate", self.handle_generate)

    async def _bootstrap_port(self, prefill: str) -> int:
        port = self._bootstrap_ports.get(prefill)
        if port is None:
            assert self.session is not None
            async with self.session.get(
                f"{prefill}/info", timeout=aiohttp.ClientTimeout(total=5)
            ) as resp:
                port = int((await resp.json())["bootstrap_port"])
            self._bootstrap_ports[prefill] = port
        return port

    async def _call(self, url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        assert self.session is not None
        try:
            async with self.session.post(url, json=body) as resp:
                try:
                    data = await resp.json(content_type=None)
                except ValueError:
                    data = {"error": "non-JSON answer"}
                return resp.status, data if isinstance(data, dict) else {"error": str(data)}
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.info("%s: %r", url, exc)  # the details stay here, not in the client's answer
            return 502, {"error": "a worker could not be reached", "reason": "peer_lost"}

    async def handle_generate(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await read_json(request)
            if not isinstance(body, dict):
                raise BadRequest("body must be a JSON object")
            if "input_ids" not in body and isinstance(body.get("text"), str):
                body["input_ids"] = list(body["text"].encode())
            ids = parse_ids(body.get("input_ids"))
            max_new = parse_positive_int(body, "max_new_tokens", 16, limits.MAX_NEW_TOKENS)
        except BadRequest as exc:
            return client_error(exc)
        prefills, decodes = self.discovery.prefill(), self.discovery.decode()
        if not prefills or not decodes:
            return error(503, "no ready prefill or decode endpoint", reason="aborted")
        prefill, decode = random.choice(prefills), random.choice(decodes)
        try:
            bootstrap_port = await self._bootstrap_port(prefill)
        except (aiohttp.ClientError, TimeoutError, KeyError, ValueError) as exc:
            self._bootstrap_ports.pop(prefill, None)
            log.info("no bootstrap info from %s: %r", prefill, exc)
            return error(503, "a prefill gave no bootstrap info", reason="peer_lost")
        room = secrets.randbits(63)  # unguessable: a room id must not be predictable
        started = time.monotonic()
        p_task = asyncio.create_task(
            self._call(f"{prefill}/generate", {"bootstrap_room": room, "input_ids": ids})
        )
        d_task = asyncio.create_task(
            self._call(
                f"{decode}/generate",
                {
                    "bootstrap_room": room,
                    "input_ids": ids,
                    "max_new_tokens": max_new,
                    "bootstrap_host": urlsplit(prefill).hostname,
                    "bootstrap_port": bootstrap_port,
                },
            )
        )
        try:
            status, answer = await d_task
            try:  # prefill finishes right after decode has its KV (or learns of the failure)
                await asyncio.wait_for(asyncio.shield(p_task), timeout=PREFILL_GRACE_S)
            except TimeoutError:
                p_task.cancel()
        except asyncio.CancelledError:  # the client went away: abort both legs
            p_task.cancel()
            d_task.cancel()
            self.metrics.failed.labels(reason="aborted").inc()
            raise
        answer.update(room=room, prefill=prefill, decode=decode)
        answer["latency_s"] = round(time.monotonic() - started, 6)
        if status == 200 and answer.get("ok"):
            self.metrics.completed.labels(role="router").inc()
            return web.json_response(answer)
        reason = answer.get("reason")
        answer["reason"] = reason if reason in FAILURE_REASONS else "transfer_error"
        self.metrics.failed.labels(reason=answer["reason"]).inc()
        return web.json_response(answer, status=status if status >= 400 else 502)
