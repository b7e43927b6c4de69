"""A lean HTTP/1.1 GET over connections kept alive per pod: the scrape path's plain-http client.

Why not aiohttp here: a scrape is the operator's most frequent act (every pod, every interval),
and aiohttp's request machinery (URL objects, tracing hooks, cookie jar, response objects, its
decompressor) cost 0.15-0.21 ms of CPU per warm request on loopback against 0.04-0.05 ms for a
GET written and read here (measured side by side, 1000 pods: `bench/operator_scale.py`). The
canaries and https targets keep aiohttp; this client speaks only what a /metrics or rooms GET
needs and refuses the rest with an error:

* one request at a time per connection; an idle connection per (host, port) is kept for the
  next cycle (`MAX_IDLE` in all, closed after `IDLE_SECONDS` unused), one that failed, was
  cancelled mid-answer or was told `Connection: close` is closed instead;
* a reused connection the server closed meanwhile (a keep-alive race: it closed just as we
  wrote) is retried once on a new connection, before any byte of an answer;
* the answer: a status line and at most `MAX_HEAD_BYTES` of headers; a body by Content-Length,
  by chunks, or to EOF, never past the caller's byte cap (`BodyTooLarge` names the size); only
  `identity` content (we ask for it: a compressed answer is refused, never inflated);
* every wait is the caller's: the scrape's one deadline cancels it, and a cancelled request's
  connection is closed, never reused.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from pdwarden.remediation.scrape.samples import ScrapeError

READ_CHUNK: Final = 64 * 1024
MAX_HEAD_BYTES: Final = READ_CHUNK  # status line and headers of one answer (the reader's limit)
MAX_HEADERS: Final = 64
MAX_IDLE: Final = 20_000  # idle connections kept in all (one per pod of a large fleet)
IDLE_SECONDS: Final = 60.0  # an idle connection unused this long is closed (its pod may be gone)


class BodyTooLarge(ScrapeError):
    """An answer over the byte cap: the pod cannot be judged until it serves less (or the
    operator is given a larger --max-metrics-bytes)."""


class _Reused(Exception):
    """A kept-alive connection ended before any byte of an answer (the server closed it)."""


@dataclass
class _Conn:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    used_at: float

    def close(self) -> None:
        self.writer.close()

    def alive(self) -> bool:
        return not (self.writer.is_closing() or self.reader.at_eof())


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes


class Http1:
    """Kept-alive plain-http GETs; `close()` ends every idle connection."""

    def __init__(self) -> None:
        self._idle: dict[tuple[str, int], _Conn] = {}
        self._swept = time.monotonic()

    @property
    def idle(self) -> int:
        return len(self._idle)

    async def get(
        self, host: str, port: int, path: str, cap: int, headers: Mapping[str, str] | None = None
    ) -> Answer:
        """GET `path` from host:port: the status and, for a 200, the body (at most `cap`
        bytes). Raises ScrapeError (BodyTooLarge over the cap), OSError or a timeout."""
        url = f"http://{_authority(host, port)}{path}"
        request = _request(host, port, path, headers or {})
        key = (host, port)
        if time.monotonic() - self._swept > IDLE_SECONDS:
            self.sweep()
        held = self._idle.pop(key, None)
        if held is not None and held.alive():
            try:
                return await self._exchange(key, held, request, url, cap, reused=True)
            except _Reused:
                pass  # the server closed it while it idled: once more on a new connection
        elif held is not None:
            held.close()
        reader, writer = await asyncio.open_connection(host, port, limit=MAX_HEAD_BYTES)
        conn = _Conn(reader, writer, time.monotonic())
        try:
            return await self._exchange(key, conn, request, url, cap, reused=False)
        except _Reused:
            raise ScrapeError(f"{url}: the connection closed before an answer") from None

    async def _exchange(
        self, key: tuple[str, int], conn: _Conn, request: bytes, url: str, cap: int, *, reused: bool
    ) -> Answer:
        keep = False
        try:
            conn.writer.write(request)
            await conn.writer.drain()
            answer, keep = await _read_answer(conn.reader, url, cap, reused=reused)
            return answer
        except (ConnectionResetError, BrokenPipeError) as e:
            if reused:
                raise _Reused() from e
            raise
        finally:
            if keep:
                self._keep(key, conn)
            else:
                conn.close()

    def _keep(self, key: tuple[str, int], conn: _Conn) -> None:
        now = time.monotonic()
        conn.used_at = now
        old = self._idle.pop(key, None)
        if old is not None:
            old.close()
        if len(self._idle) >= MAX_IDLE:
            self.sweep(now, force=True)
        self._idle[key] = conn

    def sweep(self, now: float | None = None, *, force: bool = False) -> None:
        """Close idle connections unused for IDLE_SECONDS (and, when `force`, the oldest half
        of them: the table is full)."""
        now = time.monotonic() if now is None else now
        self._swept = now
        old = [k for k, c in self._idle.items() if now - c.used_at > IDLE_SECONDS]
        if force and len(old) < len(self._idle) // 2:
            by_age = sorted(self._idle, key=lambda k: self._idle[k].used_at)
            old = by_age[: len(self._idle) // 2]
        for k in old:
            self._idle.pop(k).close()

    async def close(self) -> None:
        for conn in self._idle.values():
            conn.close()
        self._idle.clear()


def _authority(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _request(host: str, port: int, path: str, headers: Mapping[str, str]) -> bytes:
    lines = [f"GET {path} HTTP/1.1", f"Host: {_authority(host, port)}",
             "Accept-Encoding: identity", "Connection: keep-alive"]  # fmt: skip
    lines += [f"{k}: {v}" for k, v in headers.items()]
    for line in lines:
        if "\r" in line or "\n" in line:
            raise ScrapeError("a request header holds a line break")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def _read_answer(
    reader: asyncio.StreamReader, url: str, cap: int, *, reused: bool
) -> tuple[Answer, bool]:
    """(answer, whether the connection may be reused)."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as e:
        if reused and not e.partial:
            raise _Reused() from None
        raise ScrapeError(f"{url}: the connection closed before a whole answer head") from None
    except asyncio.LimitOverrunError:
        raise ScrapeError(f"{url}: answer head over {MAX_HEAD_BYTES} bytes") from None
    status, version, fields = _parse_head(head, url)
    if status != 200:
        return Answer(status, b""), False  # its body is never read: the connection goes
    if fields.get("content-encoding", "identity") != "identity":
        raise ScrapeError(f"{url}: a compressed answer ({fields['content-encoding'][:32]})")
    keep = version == "HTTP/1.1" and "close" not in fields.get("connection", "")
    coding = fields.get("transfer-encoding")
    if coding is not None:
        if coding != "chunked":
            raise ScrapeError(f"{url}: transfer-encoding {coding[:32]!r} not supported")
        return Answer(status, await _chunked(reader, url, cap)), keep
    length = fields.get("content-length")
    if length is None:
        return Answer(status, await _to_eof(reader, url, cap)), False
    if not length.isdigit() or len(length) > 18:
        raise ScrapeError(f"{url}: bad content-length {length[:32]!r}")
    if int(length) > cap:
        raise BodyTooLarge(f"{url}: answer of {int(length)} bytes is over the {cap}-byte cap")
    try:
        return Answer(status, await reader.readexactly(int(length))), keep
    except asyncio.IncompleteReadError:
        raise ScrapeError(f"{url}: the answer was cut short") from None


def _parse_head(head: bytes, url: str) -> tuple[int, str, dict[str, str]]:
    lines = head[:-4].decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or parts[0] not in ("HTTP/1.1", "HTTP/1.0") or not parts[1].isdigit():
        raise ScrapeError(f"{url}: not an HTTP/1 answer ({lines[0][:40]!r})")
    if len(lines) - 1 > MAX_HEADERS:
        raise ScrapeError(f"{url}: more than {MAX_HEADERS} answer headers")
    fields: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise ScrapeError(f"{url}: malformed answer header")
        name, value = name.lower(), value.strip()
        if name in fields and name == "content-length" and fields[name] != value:
            raise ScrapeError(f"{url}: conflicting content-length headers")
        if name in fields and name != "content-length":
            value = f"{fields[name]}, {value}"  # a repeated header is one comma-separated list
        fields[name] = value
    if "transfer-encoding" in fields:
        fields["transfer-encoding"] = fields["transfer-encoding"].lower()
        fields.pop("content-length", None)  # RFC 9112 6.3: chunked wins, the length is ignored
    fields["connection"] = fields.get("connection", "").lower()
    return int(parts[1]), parts[0], fields


async def _chunked(reader: asyncio.StreamReader, url: str, cap: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    try:
        while True:
            line = await reader.readuntil(b"\r\n")
            hex_size = line[:-2].split(b";", 1)[0].strip()
            if not hex_size or len(hex_size) > 16:
                raise ScrapeError(f"{url}: malformed chunk size")
            try:
                n = int(hex_size, 16)
            except ValueError:
                raise ScrapeError(f"{url}: malformed chunk size") from None
            if n == 0:
                break
            size += n
            if size > cap:
                raise _too_large(url, cap, size)
            data = await reader.readexactly(n + 2)
            if data[-2:] != b"\r\n":
                raise ScrapeError(f"{url}: malformed chunk")
            chunks.append(data[:-2])
        for _ in range(MAX_HEADERS + 1):  # trailers, then the empty line
            if await reader.readuntil(b"\r\n") == b"\r\n":
                return b"".join(chunks)
        raise ScrapeError(f"{url}: more than {MAX_HEADERS} trailers")
    except asyncio.IncompleteReadError:
        raise ScrapeError(f"{url}: the answer was cut short") from None
    except asyncio.LimitOverrunError:
        raise ScrapeError(f"{url}: a chunk-size line over {MAX_HEAD_BYTES} bytes") from None


async def _to_eof(reader: asyncio.StreamReader, url: str, cap: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while data := await reader.read(READ_CHUNK):
        size += len(data)
        if size > cap:
            raise _too_large(url, cap, size)
        chunks.append(data)
    return b"".join(chunks)


def _too_large(url: str, cap: int, size: int) -> BodyTooLarge:
    return BodyTooLarge(f"{url}: answer over the {cap}-byte cap (stopped at {size} bytes)")
