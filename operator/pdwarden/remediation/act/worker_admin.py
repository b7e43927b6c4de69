"""FailRooms: the pdworker admin call that fails wedged rooms by id on a prefill pod.

Why its own module: it is an action, not a scrape, and the one operator call whose answer a
worker writes at length (the ids it failed). The answer is bounded (MAX_ANSWER_BYTES: the
operator needs a count, not megabytes) and decoded off the event loop, so a hostile or broken
worker can neither stall the operator nor make it allocate without limit. The call is idempotent
on the worker (a room already failed is not failed again), which is what lets a standby replica
complete a FailRooms that a dead one started (record.journal).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any, Final, Protocol

import aiohttp

from pdwarden.remediation.scrape.http1 import BodyTooLarge
from pdwarden.remediation.scrape.worker_client import read_capped
from pdwarden.values import Target
from pdworker.contract import ADMIN_ROOMS_FAIL_PATH, FAILED_KEY

DEFAULT_TIMEOUT: Final = 5.0
# An answer lists the ids failed: 4096 ids of 20 digits fit in ~90 KiB; more is not an answer.
MAX_ANSWER_BYTES: Final = 128 * 1024
MAX_ERROR_BYTES: Final = 2048


class AdminCallError(OSError):
    """The worker's admin API did not give a usable answer (refused, timed out, garbage)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status  # the HTTP status, when the worker answered one

    @property
    def token_refused(self) -> bool:
        return self.status in (401, 403)


def failed_count(body: bytes, asked: int) -> int:
    """How many rooms the worker says it failed (never more than were asked for)."""
    try:
        data: Any = json.loads(body)
    except (ValueError, RecursionError) as e:
        raise AdminCallError(f"admin answer is not JSON: {type(e).__name__}") from None
    failed = data.get(FAILED_KEY) if isinstance(data, dict) else None
    if not isinstance(failed, list):
        raise AdminCallError("admin answer has no list of failed rooms")
    return min(len(failed), asked)


class WorkerAdmin:
    """HTTP to pdworker prefills' admin API; one session for the process, closed at shutdown."""

    def __init__(self, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=self.timeout)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def fail_rooms(self, target: Target, rooms: Sequence[int], token: str | None) -> int:
        """POST /admin/rooms/fail; how many of `rooms` the worker failed now."""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        url = target.base + ADMIN_ROOMS_FAIL_PATH
        try:
            async with self._open().post(url, json={"rooms": list(rooms)}, headers=headers) as resp:
                if resp.status != 200:
                    text = (await resp.content.read(MAX_ERROR_BYTES)).decode(errors="replace")
                    raise AdminCallError(f"{url}: HTTP {resp.status}: {text.strip()}", resp.status)
                body = await read_capped(resp, url, MAX_ANSWER_BYTES)
        except BodyTooLarge as e:
            raise AdminCallError(str(e)) from None
        except (aiohttp.ClientError, TimeoutError) as e:
            raise AdminCallError(f"{url}: {type(e).__name__}: {e}") from None
        return await asyncio.to_thread(failed_count, body, len(rooms))


class Admin(Protocol):
    async def fail_rooms(self, target: Target, rooms: Sequence[int], token: str | None) -> int: ...


async def fail_rooms(
    admin: Admin, target: Target, rooms: Sequence[int], token: str | None, fallback: str | None
) -> int:
    """`admin.fail_rooms` with `token`, and once more with `fallback` if the worker refused the
    token: after a rotation a worker may not have read its new token yet (a refused call did
    nothing, so asking again is safe)."""
    try:
        return int(await admin.fail_rooms(target, rooms, token))
    except AdminCallError as e:
        if not (e.token_refused and fallback and fallback != token):
            raise
    return int(await admin.fail_rooms(target, rooms, fallback))
