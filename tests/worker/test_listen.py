"""The guarded HTTP ports piece by piece, in-process, with real sockets on loopback.

Each rule of `listen` and `server.body_of` in isolation, with small caps and short deadlines
(test_hostile_clients.py has the real processes). Raw sockets, because an HTTP client library
would finish the heads and bodies these tests leave unfinished on purpose.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web
from test_trust_fuzz import KEY, prefill_worker

from pdworker import limits, server
from pdworker.bootstrap import BootstrapServer
from pdworker.listen import Port, connection_cap, start_guarded
from pdworker.server import wait_until, worker_app

HOST = "127.0.0.1"
PARTIAL = b"GET /healthz HTTP/1.1\r\nHost: t\r\nX-Slow: "


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def health_app(extra: dict[str, Any] | None = None) -> web.Application:
    app = web.Application()

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    app.router.add_get("/healthz", healthz)
    for path, handler in (extra or {}).items():
        app.router.add_post(path, handler)
    return app


Check = Callable[[int, Port, list[str]], Awaitable[None]]


def serve(app: web.Application, check: Check, cap: int = 4, head_timeout: float = 30) -> None:
    async def main() -> None:
        closed: list[str] = []
        port = free_port()
        runner, guard = await start_guarded(
            app, HOST, port, cap=cap, refused=closed.append, head_timeout=head_timeout
        )
        try:
            await check(port, guard, closed)
        finally:
            await runner.cleanup()

    asyncio.run(main())


async def connect(port: int, data: bytes = b"") -> tuple[asyncio.StreamReader, Any]:
    reader, writer = await asyncio.open_connection(HOST, port)
    if data:
        writer.write(data)
        await writer.drain()
    return reader, writer


async def answer(reader: asyncio.StreamReader, within: float = 5) -> bytes:
    """The status line, or b"" when the server closed the connection without one."""
    try:
        return await asyncio.wait_for(reader.readline(), within)
    except ConnectionResetError:
        return b""


async def rest_of_answer(reader: asyncio.StreamReader) -> None:
    """Read the headers and body of an answer whose status line was read."""
    length = 0
    while line := (await reader.readline()).strip():
        name, _, value = line.partition(b":")
        if name.lower() == b"content-length":
            length = int(value)
    await reader.readexactly(length)


async def get(port: int, path: str = "/healthz", headers: bytes = b"") -> bytes:
    reader, writer = await connect(port, f"GET {path} HTTP/1.1\r\nHost: t\r\n".encode()
                                   + headers + b"Connection: close\r\n\r\n")  # fmt: skip
    try:
        return await answer(reader)
    finally:
        writer.close()


def test_over_the_cap_a_new_client_takes_the_slowest_idle_connection() -> None:
    async def check(port: int, guard: Port, closed: list[str]) -> None:
        slow = [await connect(port, PARTIAL) for _ in range(4)]  # the cap, all never finished
        assert await wait_until(lambda: len(guard.conns) == 4, 5)  # all accepted
        assert (await get(port)).startswith(b"HTTP/1.1 200")
        assert await answer(slow[0][0]) == b""  # the oldest slow one made room
        assert closed == ["evicted"] and len(guard.conns) <= 4
        for _, writer in slow:
            writer.close()

    serve(health_app(), check)


def test_when_every_connection_runs_a_request_the_newcomer_is_closed() -> None:
    release = asyncio.Event()

    async def hold(_: web.Request) -> web.Response:
        await release.wait()
        return web.json_response({"held": True})

    async def check(port: int, guard: Port, closed: list[str]) -> None:
        body = b"POST /hold HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n\r\n"
        busy = [await connect(port, body) for _ in range(4)]
        assert await wait_until(lambda: sum(c.busy for c in guard.conns) == 4, 5)  # all started
        assert await get(port) == b""  # nothing to evict: refused
        assert closed == ["connection_cap"]
        release.set()
        for reader, writer in busy:  # the running requests were never touched
            assert (await answer(reader)).startswith(b"HTTP/1.1 200")
            writer.close()

    serve(health_app({"/hold": hold}), check)


def test_a_head_that_does_not_arrive_in_time_is_closed_and_an_idle_keepalive_is_not() -> None:
    async def check(port: int, guard: Port, closed: list[str]) -> None:
        slow_reader, slow_writer = await connect(port, PARTIAL)
        keep_reader, keep_writer = await connect(port, b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
        assert (await answer(keep_reader)).startswith(b"HTTP/1.1 200")
        assert await answer(slow_reader) == b""  # closed at its deadline
        assert closed == ["head_timeout"]
        await asyncio.sleep(0.6)  # idle well past the head deadline: kept alive all the same
        await rest_of_answer(keep_reader)
        keep_writer.write(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
        assert (await answer(keep_reader)).startswith(b"HTTP/1.1 200")
        for writer in (slow_writer, keep_writer):
            writer.close()

    serve(health_app(), check, head_timeout=0.3)


async def echo(request: web.Request) -> web.Response:
    try:
        body = await server.read_json(request, limits.GENERATE_BODY_BYTES)
    except server.BadRequest as exc:
        return server.client_error(exc)
    return web.json_response({"got": len(body)})


def test_a_body_that_does_not_arrive_in_time_is_408(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "BODY_TIMEOUT_S", 0.3)

    async def check(port: int, guard: Port, closed: list[str]) -> None:
        reader, writer = await connect(port, b"POST /echo HTTP/1.1\r\nHost: t\r\n"
                                       b"Content-Length: 100\r\n\r\n[1, 2")  # fmt: skip
        assert (await answer(reader)).startswith(b"HTTP/1.1 408")
        assert server.BODIES.used == 0
        writer.close()

    serve(health_app({"/echo": echo}), check)


def test_bodies_in_flight_share_one_budget_and_give_it_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(server.BODIES, "limit", 1 << 20)

    def head(size: int) -> bytes:
        return f"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: {size}\r\n\r\n".encode()

    async def check(port: int, guard: Port, closed: list[str]) -> None:
        first = await connect(port, head(700_000) + b"[1")  # holds 700 kB of the budget
        assert await wait_until(lambda: server.BODIES.used > 0, 5)
        reader, writer = await connect(port, head(700_000))
        status = await answer(reader)
        assert status.startswith(b"HTTP/1.1 503"), status  # at once, before any byte of it
        writer.close()
        first[1].write(b"]" + b" " * (700_000 - 3))  # the first body completes: 200
        assert (await answer(first[0])).startswith(b"HTTP/1.1 200")
        assert server.BODIES.used == 0
        first[1].close()

    serve(health_app({"/echo": echo}), check)


@pytest.mark.parametrize("where", ["bootstrap", "admin"])
def test_authorization_bytes_that_are_not_utf8_are_401_not_500(where: str) -> None:
    w = prefill_worker(admin_token="admin-token")
    if where == "bootstrap":
        app, request = BootstrapServer(w, KEY).app(), b"POST /bootstrap/heartbeat"
    else:
        app = worker_app(render_metrics=lambda: b"", ready=lambda: True, admin=w,
                         token="admin-token")  # fmt: skip
        request = b"GET /admin/rooms"

    async def check(port: int, guard: Port, closed: list[str]) -> None:
        for token in (b"\xff\xfe\xc3(", b"\xc3(", KEY.encode() + b"\x80"):
            reader, writer = await connect(
                port, request + b" HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer " + token
                + b"\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")  # fmt: skip
            assert (await answer(reader)).startswith(b"HTTP/1.1 401"), token
            writer.close()

    serve(app, check)


def test_connection_caps_follow_the_open_files_limit() -> None:
    assert connection_cap(1 << 20, 2) == limits.MAX_CONNECTIONS_PER_PORT
    assert connection_cap(512, 2) == 64  # (512 - reserve) / 2 for accepted, / 2 ports
    assert connection_cap(260, 2) == 8  # never below a handful


def test_a_worker_raises_its_soft_open_files_limit_towards_the_hard_one() -> None:
    import resource
    import subprocess
    import sys

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 1024:
        pytest.skip(f"hard open-files limit {hard}")
    code = (
        "import resource as r; from pdworker.listen import raise_open_files_limit as raise_; "
        "r.setrlimit(r.RLIMIT_NOFILE, (256, r.getrlimit(r.RLIMIT_NOFILE)[1])); "
        "print(raise_(1000), r.getrlimit(r.RLIMIT_NOFILE)[0])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.split() == ["1000", "1000"]
