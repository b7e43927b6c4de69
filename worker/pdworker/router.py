"""The router: one POST /generate per client request, dispatched to a prefill and a decode.

Like SGLang's routers it picks a random 63-bit bootstrap room (from `secrets`, so nobody can
predict another request's room) and calls prefill and decode
concurrently (awaiting prefill first deadlocks by construction: prefill waits for decode's
handshake). It returns decode's answer. A client that disconnects cancels both legs, which the
workers see as an abort of the room.
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
from pdworker.metrics import WorkerMetrics
from pdworker.server import BadRequest, client_error, error, read_json

log = logging.getLogger(__name__)
PREFILL_GRACE_S = 5.0


class Router:
    def __init__(
        self, discovery: Discovery, incarnation: str, request_timeout: float = 600.0
    ) -> None:
        self.discovery = discovery
        self.request_timeout = request_timeout
        self.metrics = WorkerMetrics("router", incarnation)
        self.session: aiohttp.ClientSession | None = None
        self._bootstrap_ports: dict[str, int] = {}

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=0)
        self.session = aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=self.request_timeout)
        )

    async def stop(self) -> None:
        if self.session is not None:
            await self.session.close()

    def app(self) -> web.Application:
        app = web.Application(client_max_size=limits.GENERATE_BODY_BYTES)
        app.router.add_post("/generate", self.handle_generate)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._health)
        app.router.add_get("/readyz", self._ready)
        return app

    async def _metrics(self, _: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render(), content_type="text/plain", charset="utf-8")

    async def _health(self, _: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def _ready(self, _: web.Request) -> web.Response:
        ok = bool(self.discovery.prefill() and self.discovery.decode())
        return web.json_response({"ready": ok}, status=200 if ok else 503)

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
            return 502, {"error": f"{url}: {exc!r}", "reason": "peer_lost"}

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
            return error(
                503, f"prefill {prefill} has no bootstrap info: {exc!r}", reason="peer_lost"
            )
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
