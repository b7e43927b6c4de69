"""HTTP plumbing shared by prefill and decode: /metrics, /healthz, /readyz and the admin API.

The admin API is how the operator fails wedged rooms, so it is token-protected: no token
configured means every admin call is refused (403), a missing token is 401 and a wrong one 403.
Bodies are validated here, once, into a `FailSelector`; role modules never see raw JSON.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from aiohttp import web

from pdworker import contract as c

log = logging.getLogger(__name__)
MAX_ROOMS_PER_CALL = 100_000


class BadRequest(Exception):
    """A request body that cannot be accepted; the message is returned to the caller."""


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
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if not isinstance(value, int) or not 0 <= value < 2**63:
        raise BadRequest(f"room must be an integer in [0, 2**63), got {value!r}")
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


def load_token(path: str | None) -> str | None:
    if not path:
        return None
    try:
        token = Path(path).read_text().strip()
    except OSError as exc:
        log.warning(
            "admin token file %s unreadable (%s): the admin API refuses all calls", path, exc
        )
        return None
    return token or None


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


async def read_json(request: web.Request) -> Any:
    try:
        return await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadRequest(f"body is not valid JSON: {exc}") from exc


def admin_guard(
    token: str | None,
) -> Callable[[Callable[[web.Request], Awaitable[web.StreamResponse]]], Any]:
    def wrap(
        handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
    ) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def guarded(request: web.Request) -> web.StreamResponse:
            if token is None:
                return error(
                    403,
                    "admin API disabled: no admin token configured "
                    f"(--admin-token-file / {c.ADMIN_TOKEN_FILE_ENV})",
                )
            header = request.headers.get("Authorization", "")
            if not header.startswith("Bearer "):
                return error(401, "missing bearer token (Authorization: Bearer <token>)")
            if not hmac.compare_digest(header[len("Bearer ") :].strip().encode(), token.encode()):
                return error(403, "wrong admin token")
            try:
                return await handler(request)
            except BadRequest as exc:
                return error(400, str(exc))

        return guarded

    return wrap


def worker_app(
    *,
    render_metrics: Callable[[], bytes],
    ready: Callable[[], bool],
    admin: AdminTarget,
    token: str | None,
    extra_admin: dict[str, Callable[[web.Request], Awaitable[web.StreamResponse]]] | None = None,
) -> web.Application:
    app = web.Application(client_max_size=64 * 1024 * 1024)
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
        selector = parse_fail_body(await read_json(request))
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
) -> None:
    """Serve apps until SIGTERM/SIGINT (or `stop`), then shut down within bounded time.

    handler_cancellation=True makes a client disconnect cancel its handler: that is how an
    abort reaches a room.
    """
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    runners = []
    try:
        for app, host, port in sites:
            runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
            await runner.setup()
            await web.TCPSite(runner, host, port, reuse_address=True).start()
            runners.append(runner)
            log.info("listening on http://%s:%d", host, port)
        await stop.wait()
        log.info("stopping")
        if on_stop is not None:
            await asyncio.wait_for(on_stop(), timeout=10)
    finally:
        for runner in reversed(runners):
            await asyncio.wait_for(runner.cleanup(), timeout=10)
