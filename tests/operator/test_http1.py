"""scrape.http1: the lean kept-alive GET of the scrape path, against real sockets on loopback.

Each server here is a raw asyncio server that answers every request head it reads with the next
of its scripted answers (bytes written as they are), so both well-formed answers and the broken
ones a hostile or buggy pod can send are exact; it counts the connections it accepted.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import pytest

from pdwarden.remediation.scrape import http1
from pdwarden.remediation.scrape.http1 import BodyTooLarge, Http1
from pdwarden.remediation.scrape.samples import ScrapeError

CAP = 1000


def ok(body: bytes, *extra: str) -> bytes:
    head = ["HTTP/1.1 200 OK", f"Content-Length: {len(body)}", *extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def chunked(*chunks: bytes, trailers: str = "") -> bytes:
    out = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    for c in chunks:
        out += f"{len(c):x};ext=1\r\n".encode() + c + b"\r\n"
    return out + b"0\r\n" + trailers.encode() + b"\r\n"


@dataclass
class Server:
    answers: list[bytes | Callable[[asyncio.StreamWriter], object]]
    close_after: bool = False  # close each connection after one answer
    connections: int = 0
    closed: asyncio.Event = field(default_factory=asyncio.Event)  # it closed a connection
    heads: list[bytes] = field(default_factory=list)
    port: int = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                self.heads.append(head)
                answer = self.answers.pop(0) if self.answers else ok(b"x")
                if callable(answer):
                    await answer(writer)  # type: ignore[misc]
                else:
                    writer.write(answer)
                    await writer.drain()
                if self.close_after:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()
            await writer.wait_closed()
            self.closed.set()


@asynccontextmanager
async def serving(server: Server) -> AsyncIterator[Server]:
    srv = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    server.port = srv.sockets[0].getsockname()[1]
    try:
        yield server
    finally:
        srv.close()


def run(coro: object) -> object:
    return asyncio.run(coro)  # type: ignore[arg-type]


def test_answers_come_over_one_connection_kept_alive_per_pod() -> None:
    async def go() -> None:
        async with serving(Server([ok(b"one"), ok(b"two"), chunked(b"th", b"ree")])) as s:
            client = Http1()
            got = [await client.get("127.0.0.1", s.port, "/metrics", CAP) for _ in range(3)]
            assert [(a.status, a.body) for a in got] == [(200, b"one"), (200, b"two"),
                                                         (200, b"three")]  # fmt: skip
            assert s.connections == 1 and client.idle == 1
            assert s.heads[0].startswith(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:")
            assert b"Accept-Encoding: identity" in s.heads[0]
            await client.close()

    run(go())


def test_the_token_goes_in_a_header_and_a_line_break_in_one_is_refused() -> None:
    async def go() -> None:
        async with serving(Server([ok(b"[]")])) as s:
            client = Http1()
            await client.get(
                "127.0.0.1", s.port, "/admin/rooms", CAP, {"Authorization": "Bearer t"}
            )
            assert b"\r\nAuthorization: Bearer t\r\n" in s.heads[0]
            with pytest.raises(ScrapeError, match="line break"):
                await client.get("127.0.0.1", s.port, "/m", CAP, {"X": "a\r\nHost: evil"})
            await client.close()

    run(go())


def test_a_connection_the_server_closes_or_marks_close_is_not_reused() -> None:
    async def go() -> None:
        async with serving(Server([ok(b"a", "Connection: close"), ok(b"b")])) as s:
            client = Http1()
            await client.get("127.0.0.1", s.port, "/m", CAP)
            assert client.idle == 0
            assert (await client.get("127.0.0.1", s.port, "/m", CAP)).body == b"b"
            assert s.connections == 2
            await client.close()
        old = b"HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\nz"
        async with serving(Server([old, old])) as s:
            client = Http1()
            for _ in range(2):
                assert (await client.get("127.0.0.1", s.port, "/m", CAP)).body == b"z"
            assert s.connections == 2 and client.idle == 0
            await client.close()

    run(go())


def test_a_kept_connection_the_server_closed_while_idle_is_retried_once_on_a_new_one() -> None:
    """The keep-alive race: the pod closed the connection between two cycles."""

    async def go() -> None:
        async with serving(Server([ok(b"a"), ok(b"b")], close_after=True)) as s:
            client = Http1()
            await client.get("127.0.0.1", s.port, "/m", CAP)
            assert client.idle == 1  # it said nothing of closing
            await s.closed.wait()  # the server closed it meanwhile
            assert (await client.get("127.0.0.1", s.port, "/m", CAP)).body == b"b"
            assert s.connections == 2
            await client.close()

    run(go())


def test_an_answer_without_a_length_is_read_to_its_end_and_not_reused() -> None:
    async def go() -> None:
        async with serving(Server([b"HTTP/1.1 200 OK\r\n\r\nall of it"], close_after=True)) as s:
            client = Http1()
            assert (await client.get("127.0.0.1", s.port, "/m", CAP)).body == b"all of it"
            assert client.idle == 0
            await client.close()

    run(go())


@pytest.mark.parametrize(
    ("answer", "size"),
    [
        (ok(b"x" * (CAP + 1)), f"answer of {CAP + 1} bytes is over the {CAP}-byte cap"),
        (chunked(b"x" * 600, b"y" * 600), f"over the {CAP}-byte cap (stopped at 1200 bytes)"),
        (b"HTTP/1.1 200 OK\r\n\r\n" + b"z" * 3000, f"over the {CAP}-byte cap (stopped at"),
    ],
    ids=["declared", "chunked", "to-eof"],
)
def test_an_answer_over_the_cap_is_refused_naming_its_size(answer: bytes, size: str) -> None:
    async def go() -> None:
        async with serving(Server([answer], close_after=True)) as s:
            client = Http1()
            with pytest.raises(BodyTooLarge, match=re.escape(size)):
                await client.get("127.0.0.1", s.port, "/metrics", CAP)
            assert client.idle == 0
            await client.close()

    run(go())


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (b"SSH-2.0-OpenSSH\r\n\r\n", "not an HTTP/1 answer"),
        (b"HTTP/1.1 OK\r\n\r\n", "not an HTTP/1 answer"),
        (b"HTTP/1.1 200 OK\r\n" + b"X-A: b\r\n" * 70 + b"\r\n", "more than 64 answer headers"),
        (b"HTTP/1.1 200 OK\r\nX-A: " + b"b" * 70_000 + b"\r\n\r\n", "answer head over"),
        (b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n", "malformed answer header"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", "bad content-length"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab", "conflicting"),
        (ok(b"\x1f\x8b", "Content-Encoding: gzip"), "a compressed answer"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", "transfer-encoding 'gzip'"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "malformed chunk size"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabcd", "malformed chunk"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", "cut short"),
        (b"HTTP/1.1 200 OK\r\nContent-Le", "before a whole answer head"),
    ],
)
def test_a_broken_answer_is_a_clear_error_and_its_connection_goes(answer: bytes, why: str) -> None:
    async def go() -> None:
        async with serving(Server([answer], close_after=True)) as s:
            client = Http1()
            with pytest.raises(ScrapeError, match=why):
                await client.get("127.0.0.1", s.port, "/metrics", CAP)
            assert client.idle == 0
            await client.close()

    run(go())


def test_chunk_extensions_and_trailers_are_read_past() -> None:
    async def go() -> None:
        async with serving(Server([chunked(b"ab", b"c", trailers="X-T: 1\r\n"), ok(b"d")])) as s:
            client = Http1()
            assert (await client.get("127.0.0.1", s.port, "/m", CAP)).body == b"abc"
            assert (await client.get("127.0.0.1", s.port, "/m", CAP)).body == b"d"
            assert s.connections == 1
            await client.close()

    run(go())


def test_an_error_status_is_returned_without_its_body_and_the_connection_goes() -> None:
    async def go() -> None:
        async with serving(
            Server([b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 3\r\n\r\nno!"])
        ) as s:
            client = Http1()
            answer = await client.get("127.0.0.1", s.port, "/admin/rooms", CAP)
            assert (answer.status, answer.body, client.idle) == (401, b"", 0)
            await client.close()

    run(go())


def test_a_request_cancelled_mid_answer_closes_its_connection() -> None:
    """The scrape's deadline cancels the GET: that connection, half read, is never reused."""

    async def slow(writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npart")
        await writer.drain()
        await asyncio.Event().wait()  # never answers the rest

    async def go() -> None:
        async with serving(Server([slow, ok(b"fresh")])) as s:
            client = Http1()
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.2):
                    await client.get("127.0.0.1", s.port, "/m", CAP)
            assert client.idle == 0
            assert (await client.get("127.0.0.1", s.port, "/m", CAP)).body == b"fresh"
            assert s.connections == 2
            await client.close()

    run(go())


def test_idle_connections_are_closed_after_idle_seconds_and_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def go() -> None:
        async with serving(Server([])) as s, serving(Server([])) as t, serving(Server([])) as u:
            client = Http1()
            await client.get("127.0.0.1", s.port, "/m", CAP)
            await client.get("127.0.0.1", t.port, "/m", CAP)
            assert client.idle == 2
            client.sweep(now=time.monotonic() + 10 * http1.IDLE_SECONDS)
            assert client.idle == 0
            monkeypatch.setattr(http1, "MAX_IDLE", 2)
            for server in (s, t, u):  # the third finds the table full: the oldest half goes
                await client.get("127.0.0.1", server.port, "/m", CAP)
            assert sorted(port for _, port in client._idle) == sorted([t.port, u.port])
            await client.close()
            assert client.idle == 0

    run(go())
