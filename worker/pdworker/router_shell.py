"""What every router mode shares: the client session, /metrics, /healthz and /readyz.

Why a base: pdworker's rooms (router.py) and vLLM's PD protocol (vllm_router.py) differ only in
how one request crosses prefill and decode; the session, the probes and the metrics must not
drift apart between them.
"""

from __future__ import annotations

import aiohttp
from aiohttp import web

from pdworker import limits
from pdworker.discovery import Discovery
from pdworker.metrics import WorkerMetrics


class RouterShell:
    def __init__(
        self, discovery: Discovery, incarnation: str, request_timeout: float = 600.0
    ) -> None:
        self.discovery = discovery
        self.request_timeout = request_timeout
        self.metrics = WorkerMetrics("router", incarnation)
        self.session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),
            timeout=aiohttp.ClientTimeout(total=self.request_timeout),
        )

    async def stop(self) -> None:
        if self.session is not None:
            await self.session.close()

    def app(self) -> web.Application:
        app = web.Application(client_max_size=limits.GENERATE_BODY_BYTES)
        self.add_routes(app)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._health)
        app.router.add_get("/readyz", self._ready)
        return app

    def add_routes(self, app: web.Application) -> None:
        """The mode's request routes."""
        raise NotImplementedError

    async def _metrics(self, _: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render(), content_type="text/plain", charset="utf-8")

    async def _health(self, _: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def _ready(self, _: web.Request) -> web.Response:
        ok = bool(self.discovery.prefill() and self.discovery.decode())
        return web.json_response({"ready": ok}, status=200 if ok else 503)
