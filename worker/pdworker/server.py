"""HTTP plumbing shared by prefill and decode: /metrics, /healthz, /readyz and the admin API.

The admin API is how the operator fails wedged rooms, so it is token-protected: no token
configured means every admin call is refused (403), a missing or malformed token is 401 and a
wrong one 403. Bodies are validated here, once, into a `FailSelector`; role modules never see
raw JSON. Every body any worker reads goes through `body_of`: under its endpoint's cap, within
BODY_TIMEOUT_S, and inside the process's budget of bodies in flight (`BODIES`), so a few
connections that send large bodies slowly can neither pin memory nor hold a handler for long.
Every port is served by `serve_until_stopped` through `listen` (connection caps, head deadlines).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from aiohttp import web

from pdworker import contract as c
from pdworker import limits
from pdworker.listen import connection_cap, raise_open_files_limit, start_guarded
from pdworker.secret_file import Secret

log = logging.getLogger(__name__)
MAX_ROOMS_PER_CALL = limits.MAX_ROOMS_PER_CALL


class BadRequest(Exception):
    """A request body that cannot be accepted; the message is returned to the caller."""


class TooLarge(BadRequest):
    """A request body over its endpoint's cap (413)."""


class TooSlow(BadRequest):
    """A request body that did not arrive within BODY_TIMEOUT_S (408)."""


class Busy(BadRequest):
    """The process's budget of bodies in flight is spent (503: retry)."""


class BodyBudget:
    """Bytes of request bodies being read or parsed at once in this process (event loop only)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def take(self, size: int) -> None:
        if self.used + size > self.limit:
            raise Busy(f"this server reads {self.used} bytes of other bodies now; retry")
        self.used += size

    def give(self, size: int) -> None:
        self.used -= size


BODIES = BodyBudget(limits.INFLIGHT_BODY_BYTES)


@dataclass(frozen=True)
class FailSelector:
    rooms: list[int] | None = None
    older_than_seconds: float | None = None
    peer_incarnation: str | None = None


class AdminTarget(Protocol):
    def list_rooms(self) -> list[dict[str, Any]]: ...

    async def fail_rooms(self, selector: FailSelector) -> list[int]: ...


def parse_room(value: Any) -> int:
    """A bootstrap room: a 63-bit non-negative integer (as a JSON number or decimal string)."""
    if isinstance(value, bool):
        raise BadRequest(f"room must be an integer, got {value!r}")
    if isinstance(value, str):
        # ASCII digits only: "²".isdigit() is True but int("²") raises.
        if not (0 < len(value) <= 19 and value.isascii() and value.isdigit()):
            raise BadRequest(f"room must be an integer in [0, 2**63), got {value[:40]!r}")
        value = int(value)
    if not isinstance(value, int) or not 0 <= value < 2**63:
        raise BadRequest(f"room must be an integer in [0, 2**63), got {str(value)[:40]!r}")
    return value


def parse_fail_body(body: Any) -> FailSelector:
    if not isinstance(body, dict):
        raise BadRequest(
            "body must be a JSON object with one of: rooms, older_than_seconds, peer_incarnation"
        )
    known = {"rooms", "older_than_seconds", "peer_incarnation"}
    unknown = sorted(set(body) - known)
    if unknown:
        raise BadRequest(f"unknown field(s) {unknown}; expected one of {sorted(known)}")
    given = [k for k in known if k in body]
    if len(given) != 1:
        raise BadRequest(f"give exactly one of {sorted(known)} (got {sorted(given)})")
    key = given[0]
    value = body[key]
    if key == "rooms":
        if not isinstance(value, list) or not value or len(value) > MAX_ROOMS_PER_CALL:
            raise BadRequest("rooms must be a non-empty list of room ids")
        return FailSelector(rooms=[parse_room(v) for v in value])
    if key == "older_than_seconds":
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise BadRequest("older_than_seconds must be a number >= 0")
        return FailSelector(older_than_seconds=float(value))
    if not isinstance(value, str) or not value:
        raise BadRequest("peer_incarnation must be a non-empty string")
    return FailSelector(peer_incarnation=value)


async def wait_until(cond: Callable[[], bool], seconds: float, interval: float = 0.01) -> bool:
    """Poll a condition that other threads change, with a deadline; True if it came true."""
    deadline = asyncio.get_running_loop().time() + seconds
    while True:
        if cond():
            return True
        if asyncio.get_running_loop().time() >= deadline:
            return False
        await asyncio.sleep(interval)


def error(status: int, message: str, **extra: Any) -> web.Response:
    return web.json_response({"error": message, **extra}, status=status)


@contextlib.asynccontextmanager
async def body_of(request: web.Request, max_bytes: int) -> AsyncIterator[bytes]:
    """The raw body, held inside the process's body budget until the block ends.

    Refused as soon as it passes `max_bytes` (TooLarge, never buffered whole), when it does not
    arrive within BODY_TIMEOUT_S (TooSlow) or when the budget cannot hold it (Busy): a declared
    length is taken from the budget before any byte is read, an undeclared one chunk by chunk.
    """
    declared = request.content_length
    if declared is not None and declared > max_bytes:
        raise TooLarge(f"body of {declared} bytes is over this endpoint's limit of {max_bytes}")
    held = 0
    try:
        if declared:
            BODIES.take(declared)
            held = declared
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(limits.BODY_TIMEOUT_S):
                while chunk := await request.content.read(64 * 1024):
                    size += len(chunk)
                    if size > max_bytes:
                        raise TooLarge(f"body is over this endpoint's limit of {max_bytes} bytes")
                    if size > held:
                        BODIES.take(size - held)
                        held = size
                    chunks.append(chunk)
        except TimeoutError:
            raise TooSlow(f"body did not arrive within {limits.BODY_TIMEOUT_S:g}s") from None
        raw = b"".join(chunks)
        del chunks
        yield raw
    finally:
        BODIES.give(held)


def parse_json(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    # ValueError: also an integer literal over Python's digit limit; RecursionError: deep nesting.
    except (ValueError, RecursionError) as exc:
        raise BadRequest(f"body is not valid JSON: {str(exc)[:200]}") from None


async def read_json(request: web.Request, max_bytes: int = limits.GENERATE_BODY_BYTES) -> Any:
    """Read and parse a JSON body under a cap; a large body is parsed off the event loop. The
    raw bytes count against the body budget until they are parsed."""
    async with body_of(request, max_bytes) as raw:
        if len(raw) > limits.PARSE_INLINE_BYTES:
            return await asyncio.to_thread(parse_json, raw)
        return parse_json(raw)


def client_error(exc: BadRequest) -> web.Response:
    """400, or 413 / 408 / 503 for a body refused by its cap, its deadline or the budget; those
    close the connection (the rest of the body is not read)."""
    status = {TooLarge: 413, TooSlow: 408, Busy: 503}.get(type(exc), 400)
    response = error(status, str(exc))
    if status != 400:
        response.force_close()
        if status == 503:
            response.headers["Retry-After"] = "1"
    return response


def presented_token(header: str, scheme: str = "Bearer ") -> bytes | None:
    """The token in an `Authorization: Bearer <token>` header, as bytes; None when there is
    none or when it is not UTF-8 (aiohttp hands undecodable header bytes over as surrogates)."""
    if not header.startswith(scheme):
        return None
    try:
        return header[len(scheme) :].strip().encode()
    except UnicodeEncodeError:
        return None


def admin_guard(
    token: Secret | str | None,
) -> Callable[[Callable[[web.Request], Awaitable[web.StreamResponse]]], Any]:
    secret = Secret.of(token, "admin")

    def wrap(
        handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
    ) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def guarded(request: web.Request) -> web.StreamResponse:
            if not secret.accepted():
                return error(
                    403,
                    "admin API disabled: no admin token configured "
                    f"(--admin-token-file / {c.ADMIN_TOKEN_FILE_ENV})",
                )
            presented = presented_token(request.headers.get("Authorization", ""))
            if presented is None:
                return error(
                    401, "missing or malformed bearer token (Authorization: Bearer <token>)"
                )
            if secret.matching(presented) is None:
                return error(403, "wrong admin token")
            try:
                return await handler(request)
            except BadRequest as exc:
                return client_error(exc)

        return guarded

    return wrap


def worker_app(
    *,
    render_metrics: Callable[[], bytes],
    ready: Callable[[], bool],
    admin: AdminTarget,
    token: Secret | str | None,
    extra_admin: dict[str, Callable[[web.Request], Awaitable[web.StreamResponse]]] | None = None,
) -> web.Application:
    # Each handler reads its own body under its own cap (read_json); this is the ceiling.
    app = web.Application(client_max_size=limits.GENERATE_BODY_BYTES)
    guard = admin_guard(token)

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=render_metrics(), content_type="text/plain", charset="utf-8")

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def readyz(_: web.Request) -> web.Response:
        ok = ready()
        return web.json_response({"ready": ok}, status=200 if ok else 503)

    async def rooms(_: web.Request) -> web.Response:
        return web.json_response(admin.list_rooms())

    async def fail(request: web.Request) -> web.Response:
        selector = parse_fail_body(await read_json(request, limits.ADMIN_BODY_BYTES))
        failed = await admin.fail_rooms(selector)
        return web.json_response({"failed": failed})

    app.router.add_get(c.METRICS_PATH, metrics)
    app.router.add_get(c.HEALTHZ_PATH, healthz)
    app.router.add_get(c.READYZ_PATH, readyz)
    app.router.add_get(c.ADMIN_ROOMS_PATH, guard(rooms))
    app.router.add_post(c.ADMIN_ROOMS_FAIL_PATH, guard(fail))
    for path, handler in (extra_admin or {}).items():
        app.router.add_post(path, guard(handler))
    return app


async def serve_until_stopped(
    sites: list[tuple[web.Application, str, int]],
    stop: asyncio.Event,
    on_stop: Callable[[], Awaitable[None]] | None = None,
    refused: Callable[[str], None] = lambda _reason: None,
) -> None:
    """Serve apps until SIGTERM/SIGINT (or `stop`), then shut down within bounded time.

    Each port is a `listen.GuardedSite` (a connection cap, head deadlines); `refused` counts the
    connections they close, by reason. handler_cancellation=True makes a client disconnect
    cancel its handler: that is how an abort reaches a room.
    """
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    cap = connection_cap(raise_open_files_limit(), len(sites))
    runners = []
    try:
        for app, host, port in sites:
            runner, _ = await start_guarded(app, host, port, cap=cap, refused=refused)
            runners.append(runner)
            log.info("listening on http://%s:%d (at most %d connections)", host, port, cap)
        await stop.wait()
        log.info("stopping")
        if on_stop is not None:
            await asyncio.wait_for(on_stop(), timeout=10)
    finally:
        for runner in reversed(runners):
            await asyncio.wait_for(runner.cleanup(), timeout=10)
