"""How the worker's HTTP ports accept connections from clients they cannot trust.

Why: aiohttp waits for a request head as long as its keep-alive timeout (an hour by default) and
accepts connections until the process runs out of file descriptors; asyncio then stops
accepting on every port of the process, a second at a time, so a few hundred connections that
never finish their head (slow-loris) silence readiness probes and prefill's bootstrap heartbeats.
Every port served by `serve_until_stopped` is a `GuardedSite`:

* a cap on open connections per port (`connection_cap`: MAX_CONNECTIONS_PER_PORT, and never more
  than the open-files limit allows). A connection over the cap closes the oldest connection that
  runs no request (idle, or still sending its head): what slow clients hold is what a new client
  (a probe, a heartbeat) takes. Only when every connection runs a request is the newcomer closed;
* a request head must arrive within HEAD_TIMEOUT_S of connecting, or of its first byte on a
  kept-alive connection; idle kept-alive connections close after KEEPALIVE_S;
* request bodies have a deadline and a per-process budget (server.body_of);
* the soft open-files limit is raised towards the hard one (`raise_open_files_limit`).

A connection "runs a request" from the moment its handler starts until its response is written
(`track`, a middleware every guarded app gets).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from pdworker import limits

log = logging.getLogger(__name__)
Refused = Callable[[str], None]  # counts a closed connection by reason
LOG_EVERY_S = 10.0


def raise_open_files_limit(target: int = limits.OPEN_FILES_TARGET) -> int:
    """Raise the soft open-files limit to `target` (or the hard limit); the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = target if hard == resource.RLIM_INFINITY else min(hard, target)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open-files limit to %d: %s", want, exc)
    return target if soft == resource.RLIM_INFINITY else soft


def connection_cap(open_files: int, ports: int) -> int:
    """Connections one port may hold: half of what FD_RESERVE leaves, split between `ports`."""
    share = (open_files - limits.FD_RESERVE) // 2 // max(1, ports)
    return max(8, min(limits.MAX_CONNECTIONS_PER_PORT, share))


class Port:
    """The open connections of one listening port, oldest first (event loop only)."""

    def __init__(self, name: str, cap: int, refused: Refused) -> None:
        self.name = name
        self.cap = cap
        self.refused = refused
        self.conns: dict[Conn, None] = {}
        self.by_handler: dict[int, Conn] = {}  # id(aiohttp's protocol) -> its connection
        self.closed: dict[str, int] = {}
        self.logged = 0.0

    def admit(self, conn: Conn) -> bool:
        if len(self.conns) >= self.cap:
            victim = next((c for c in self.conns if not c.busy), None)
            if victim is None:
                self.count("connection_cap")
                return False
            self.count("evicted")
            victim.close()
        self.conns[conn] = None
        return True

    def forget(self, conn: Conn) -> None:
        self.conns.pop(conn, None)
        self.by_handler.pop(id(conn.inner), None)

    def count(self, reason: str) -> None:
        self.refused(reason)
        self.closed[reason] = self.closed.get(reason, 0) + 1
        now = time.monotonic()
        if now - self.logged >= LOG_EVERY_S:  # what a hostile client causes is logged, sparsely
            self.logged = now
            log.warning("%s: connections closed so far, by reason: %s", self.name, self.closed)


class Conn(asyncio.Protocol):
    """aiohttp's protocol for one connection, with the cap and the head deadline around it."""

    def __init__(self, port: Port, inner: Any, head_timeout: float) -> None:
        self.port = port
        self.inner = inner
        self.head_timeout = head_timeout
        self.busy = 0  # requests running (handler started, response not yet written)
        self.admitted = False
        self.transport: asyncio.Transport | None = None
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        if not self.port.admit(self):
            transport.abort()
            return
        self.admitted = True
        self.port.by_handler[id(self.inner)] = self
        self.inner.connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if not self.busy and self.timer is None:
            self._arm()  # the first byte of a head on a kept-alive connection
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        result: bool | None = self.inner.eof_received()
        return result

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self.port.forget(self)
        if self.admitted:
            self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def started(self) -> None:
        self.busy += 1
        self._disarm()

    def ended(self) -> None:
        self.busy -= 1  # the next head's first byte arms the deadline again

    def close(self) -> None:
        self.port.forget(self)
        if self.transport is not None:
            self.transport.abort()

    def _arm(self) -> None:
        loop = asyncio.get_running_loop()
        self.timer = loop.call_later(self.head_timeout, self._head_late)

    def _disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _head_late(self) -> None:
        self.timer = None
        if not self.busy:
            self.port.count("head_timeout")
            self.close()


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def track(port: Port) -> Any:
    """A middleware marking a connection busy while its request runs and its answer is written
    (so the cap never closes a connection in the middle of either)."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        conn = port.by_handler.get(id(request.protocol))
        if conn is not None:
            conn.started()
        try:
            response = await handler(request)
            if conn is not None and not response.prepared:
                with contextlib.suppress(ConnectionError):  # aiohttp's own write tells it too
                    await response.prepare(request)
                    await response.write_eof()
            return response
        finally:
            if conn is not None:
                conn.ended()

    return middleware


class GuardedSite(web.BaseSite):
    """A TCP site (web.TCPSite's job) whose connections are `Conn`s of one `Port`."""

    def __init__(
        self,
        runner: web.AppRunner,
        host: str,
        port: int,
        guard: Port,
        head_timeout: float = limits.HEAD_TIMEOUT_S,
    ) -> None:
        super().__init__(runner)
        self._host = host
        self._port = port
        self.guard = guard
        self.head_timeout = head_timeout

    @property
    def name(self) -> str:
        return f"http://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: Conn(self.guard, server(), self.head_timeout),
            self._host,
            self._port,
            reuse_address=True,
        )


async def start_guarded(
    app: web.Application,
    host: str,
    port: int,
    *,
    cap: int,
    refused: Refused,
    head_timeout: float = limits.HEAD_TIMEOUT_S,
) -> tuple[web.AppRunner, Port]:
    """Serve `app` on host:port as a guarded site; the runner (cleanup() stops it) and port."""
    guard = Port(f"{host}:{port}", cap, refused)
    app.middlewares.append(track(guard))
    runner = web.AppRunner(
        app,
        handler_cancellation=True,
        access_log=None,
        keepalive_timeout=limits.KEEPALIVE_S,
        lingering_time=limits.LINGER_S,
    )
    await runner.setup()
    await GuardedSite(runner, host, port, guard, head_timeout).start()
    return runner, guard
