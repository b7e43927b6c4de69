"""Scrape every worker pod's /metrics (and pdworker prefill rooms) by pod IP, concurrently.

Why an adapter of its own: it is the operator's only network path to workers. Concurrency is
bounded, every request has a deadline, and any failure (refused, timeout, garbage) becomes a
per-pod error string, so one bad pod can neither stall a scrape cycle nor crash it.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass

import aiohttp

from pdwarden.constants import WORKER_PORT
from pdwarden.samples import RoomView, Sample, ScrapeError, parse_metrics, parse_rooms
from pdworker.contract import ADMIN_ROOMS_FAIL_PATH, ADMIN_ROOMS_PATH, METRICS_PATH

DEFAULT_CONCURRENCY = 64
DEFAULT_TIMEOUT = 2.0
MAX_BODY = 4 * 1024 * 1024


@dataclass(frozen=True)
class Target:
    pod: str
    uid: str
    role: str
    ip: str
    port: int = WORKER_PORT
    rooms: bool = False  # also read GET /admin/rooms (pdworker prefill)

    @property
    def base(self) -> str:
        return f"http://{self.ip}:{self.port}"


@dataclass(frozen=True)
class ScrapeResult:
    target: Target
    sample: Sample | None = None
    rooms: tuple[RoomView, ...] | None = None
    error: str | None = None


class WorkerClient:
    """HTTP to worker pods: metrics, rooms, and the admin call that fails rooms."""

    def __init__(
        self, concurrency: int = DEFAULT_CONCURRENCY, timeout: float = DEFAULT_TIMEOUT
    ) -> None:
        self.timeout = aiohttp.ClientTimeout(total=timeout)
        self._limit = asyncio.Semaphore(concurrency)
        self._session: aiohttp.ClientSession | None = None

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=self.timeout, connector=aiohttp.TCPConnector(limit=0, force_close=False)
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def _get(self, url: str, token: str | None = None) -> str:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with self._limit, self.session().get(url, headers=headers) as resp:
            body = await resp.content.read(MAX_BODY + 1)
            if len(body) > MAX_BODY:
                raise ScrapeError(f"{url}: answer larger than {MAX_BODY} bytes")
            if resp.status != 200:
                raise ScrapeError(f"{url}: HTTP {resp.status}")
            return body.decode("utf-8", errors="replace")

    async def scrape_one(self, target: Target, token: str | None) -> ScrapeResult:
        try:
            text = await self._get(target.base + METRICS_PATH)
            sample = parse_metrics(text, time.monotonic())
            rooms = None
            if target.rooms:
                raw = await self._get(target.base + ADMIN_ROOMS_PATH, token)
                rooms = tuple(parse_rooms(json.loads(raw)))
            return ScrapeResult(target, sample, rooms)
        except ScrapeError as e:
            return ScrapeResult(target, error=str(e))
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as e:
            return ScrapeResult(target, error=f"{type(e).__name__}: {e}".strip(": "))

    async def scrape(self, targets: Sequence[Target], token: str | None) -> list[ScrapeResult]:
        return list(await asyncio.gather(*(self.scrape_one(t, token) for t in targets)))

    async def fail_rooms(self, target: Target, rooms: Sequence[int], token: str | None) -> int:
        """POST /admin/rooms/fail; returns how many rooms the worker reports it failed."""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        url = target.base + ADMIN_ROOMS_FAIL_PATH
        async with (
            self._limit,
            self.session().post(url, json={"rooms": list(rooms)}, headers=headers) as resp,
        ):
            if resp.status != 200:
                text = (await resp.content.read(2048)).decode(errors="replace")
                raise ScrapeError(f"{url}: HTTP {resp.status}: {text}")
            data = await resp.json()
        failed = data.get("failed") if isinstance(data, dict) else None
        return len(failed) if isinstance(failed, list) else 0
