"""Scrape every worker pod's /metrics (and pdworker prefill rooms) by pod IP: the operator's one
reader of what engines serve.

Why an adapter of its own: it is the only code that reads a worker's /metrics (actions in `act/`
ask it too), so every bound lives here once. Each tenant (one PDDeployment or
PDRemediationPolicy, keyed by its uid) gets its own share: its own connection slots and one
parse at a time, so a tenant whose pods answer slowly, endlessly or with costly bodies spends its
own share and nobody else's (issue 26). Every scrape has one deadline that covers the wait for a
slot, the request, the read and the parse together; the parse runs on the event loop in steps of
a bounded number of lines (`samples.parse_steps`) and stops at the deadline, so a parse that
misses it is cancelled, not left running. Bodies are read to EOF or to a cap (over it: an error
naming the size, marked `refused="too_large"` so the owner object can say so). Plain-http pods
are asked through `http1` (a lean GET over a connection kept alive per pod: a scrape is the
operator's most frequent act), https ones through aiohttp.

Why steps on the loop rather than a thread pool: a parse thread competes for the same GIL as the
loop and cannot be stopped, and a shared pool queues one tenant's parses behind another's. A
step holds the loop for about `samples.STEP_SECONDS` (0.5 ms), and lines of names nobody reads
are skipped by C-speed substring search (1-2 ms per MiB however the body is cut into lines,
against 30-60 ms for the line-by-line parser of before; tests/operator/test_scrape_tenants.py
holds the isolation).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Final, TypeVar

import aiohttp

from pdwarden.remediation.scrape.http1 import BodyTooLarge, Http1
from pdwarden.remediation.scrape.samples import (
    MAX_TEXT_BYTES,
    ScrapeError,
    Steps,
    json_answer,
    parse_rooms,
    parse_steps,
)
from pdwarden.values import RoomView, ScrapeResult, Target
from pdworker.contract import ADMIN_ROOMS_PATH

DEFAULT_TENANT_CONNECTIONS: Final = 16  # concurrent requests of one tenant's scrapes
DEFAULT_TIMEOUT: Final = 2.0  # one scrape, all of it: slot wait, request, read, parse
# --max-metrics-bytes. Sized from SGLang 0.5.23's own metric definitions
# (tests/operator/test_metrics_cap.py renders the body a TP8/DP8 pod serves): ~1.6 MB with
# every histogram, ~2.9 MB with 16 request priorities as well; 1 MiB refused even a TP8 pod.
# Each of a tenant's connection slots may hold one body: DEFAULT_TENANT_CONNECTIONS x the cap
# is one tenant's worst case (64 MiB).
DEFAULT_MAX_BODY: Final = 4 * 1024 * 1024
MAX_BODY_LIMIT: Final = MAX_TEXT_BYTES  # the most the flag may allow (16 MiB)
READ_CHUNK: Final = 64 * 1024
JSON_THREADS: Final = 2
TOO_LARGE: Final = "too_large"


class TokenRefused(ScrapeError):
    """A worker's admin API refused the token (401/403)."""


T = TypeVar("T")


async def read_capped(resp: aiohttp.ClientResponse, url: str, cap: int) -> bytes:
    """The whole body, read until EOF; over `cap` bytes is an error that names the size.

    (`resp.content.read(n)` returns only what is buffered: a 1.6 MiB body came back as
    127,842 bytes, and a cut on a line boundary silently drops series.)
    """
    if resp.content_length is not None and resp.content_length > cap:
        raise BodyTooLarge(
            f"{url}: answer of {resp.content_length} bytes is over the {cap}-byte cap"
        )
    chunks: list[bytes] = []
    size = 0
    async for chunk in resp.content.iter_chunked(READ_CHUNK):
        size += len(chunk)
        if size > cap:
            raise BodyTooLarge(f"{url}: answer over the {cap}-byte cap (stopped at {size} bytes)")
        chunks.append(chunk)
    return b"".join(chunks)


def parse_rooms_body(body: bytes) -> tuple[RoomView, ...]:
    """Decode and validate a GET /admin/rooms answer (runs on the JSON threads)."""
    return tuple(parse_rooms(json_answer(body, "admin rooms answer")))


async def run_stepwise(steps: Steps[T]) -> T:
    """Drive a stepwise parse, giving the event loop a turn between steps; a cancellation (the
    scrape's deadline) stops it between two steps."""
    try:
        while True:
            next(steps)
            await asyncio.sleep(0)
    except StopIteration as done:
        result: T = done.value
        return result
    finally:
        steps.close()


@dataclass
class Share:
    """One tenant's part of the client: its connection slots and its parse lane."""

    slots: asyncio.Semaphore
    parsing: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(1))


class WorkerClient:
    """HTTP to worker pods: /metrics and the pdworker rooms list, per tenant."""

    def __init__(
        self,
        connections_per_tenant: int = DEFAULT_TENANT_CONNECTIONS,
        timeout: float = DEFAULT_TIMEOUT,
        max_body: int = DEFAULT_MAX_BODY,
        lean_http: bool = True,
    ) -> None:
        """`lean_http` False asks plain-http pods through aiohttp too, as https ones always are
        (bench/operator_scale.py measures the two side by side)."""
        if not 0 < max_body <= MAX_BODY_LIMIT:
            raise ValueError(f"max_body must be between 1 and {MAX_BODY_LIMIT} bytes")
        if connections_per_tenant < 1 or timeout <= 0:
            raise ValueError("connections_per_tenant must be >= 1 and timeout > 0")
        self.deadline = timeout
        self.max_body = max_body
        self.connections_per_tenant = connections_per_tenant
        self._shares: dict[str, Share] = {}
        self._session: aiohttp.ClientSession | None = None
        self._json: ThreadPoolExecutor | None = None
        self._http1 = Http1() if lean_http else None

    def share(self, tenant: str) -> Share:
        held = self._shares.get(tenant)
        if held is None:
            held = self._shares[tenant] = Share(asyncio.Semaphore(self.connections_per_tenant))
        return held

    def forget(self, tenant: str) -> None:
        """The tenant is gone (its object was deleted): drop its share."""
        self._shares.pop(tenant, None)

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # The deadline is ours (asyncio.timeout around each scrape); the session's own
            # total timeout is only a backstop for a request made outside one.
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.deadline),
                connector=aiohttp.TCPConnector(limit=0, force_close=False),
            )
        return self._session

    async def close(self) -> None:
        if self._http1 is not None:
            await self._http1.close()
        if self._session is not None:
            await self._session.close()
        if self._json is not None:
            self._json.shutdown(wait=False, cancel_futures=True)
            self._json = None

    async def _get(
        self, share: Share, target: Target, path: str, token: str | None = None
    ) -> bytes:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        url = target.base + path
        async with share.slots:
            if self._http1 is not None and target.scheme == "http":
                answer = await self._http1.get(target.ip, target.port, path, self.max_body,
                                               headers)  # fmt: skip
                status, body = answer.status, answer.body
            else:
                async with self.session().get(url, headers=headers) as resp:
                    status = resp.status
                    body = await read_capped(resp, url, self.max_body) if status == 200 else b""
        if status in (401, 403) and token:
            raise TokenRefused(f"{url}: HTTP {status}: the admin token was refused")
        if status != 200:
            raise ScrapeError(f"{url}: HTTP {status}")
        return body

    async def _rooms(self, raw: bytes) -> tuple[RoomView, ...]:
        if self._json is None:
            self._json = ThreadPoolExecutor(JSON_THREADS, thread_name_prefix="pdwarden-json")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._json, parse_rooms_body, raw)

    async def scrape_one(self, target: Target, token: str | None, tenant: str = "") -> ScrapeResult:
        """One pod: its sample (and rooms), or an error string; never raises (but cancellation)."""
        share = self.share(tenant)
        try:
            async with asyncio.timeout(self.deadline):
                body = await self._get(share, target, target.metrics_path)
                text = body.decode("utf-8", errors="replace")
                async with share.parsing:
                    sample = await run_stepwise(parse_steps(text, time.monotonic(), target.engine))
                rooms = None
                if target.rooms:
                    raw = await self._get(share, target, ADMIN_ROOMS_PATH, token)
                    rooms = await self._rooms(raw)
            return ScrapeResult(target, sample, rooms)
        except TimeoutError:
            return ScrapeResult(
                target,
                error=f"no usable answer within the {self.deadline:g}s scrape deadline "
                "(connection slot, request, read and parse together)",
            )
        except BodyTooLarge as e:
            return ScrapeResult(target, error=str(e), refused=TOO_LARGE)
        except TokenRefused as e:
            return ScrapeResult(target, error=str(e), auth_refused=True)
        except ScrapeError as e:
            return ScrapeResult(target, error=str(e))
        except (aiohttp.ClientError, OSError, ValueError) as e:
            return ScrapeResult(target, error=f"{type(e).__name__}: {e}".strip(": "))

    async def scrape(
        self, targets: Sequence[Target], token: str | None, tenant: str = ""
    ) -> list[ScrapeResult]:
        return list(await asyncio.gather(*(self.scrape_one(t, token, tenant) for t in targets)))
