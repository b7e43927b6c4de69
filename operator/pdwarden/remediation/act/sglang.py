"""The one repair call a stock SGLang prefill accepts: abort every request it holds.

Why its own module: SGLang 0.5.23 has no API that lists rooms or request ids, and its prefill
applies no timeout to rooms in the inflight queue (disaggregation/prefill.py), so a wedged room
stays there for ever. What does free it is `POST /abort_request {"rid": "", "abort_all": true}`
(entrypoints/http_server.py -> TokenizerManager.abort_request -> Scheduler.abort_request in
managers/scheduler.py): the scheduler drops its waiting queue, calls the KV sender's `abort()`
for every request in the bootstrap and inflight queues (disaggregation/common/conn.py marks the
room Failed, a terminal status), finishes running requests with FINISH_ABORT, and the next
inflight poll releases their KV. The endpoint answers 200 whatever it aborted, and SGLang's
`sglang:num_aborted_requests_total` counts calls, not requests, so the cost is measured here:
the prefill's queue gauges are read just before (every request they count is aborted) and just
after the call. Every call is bounded (timeouts, body caps); nothing here decides whether to call.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Protocol

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

ABORT_PATH: Final = "/abort_request"
METRICS_PATH: Final = "/metrics"
DEFAULT_TIMEOUT: Final = 5.0
MAX_METRICS_BODY: Final = 16 * 1024 * 1024
MAX_ERROR_BODY: Final = 2048
# SGLang 0.5.23 observability/metrics_collector.py: the queues of a prefill scheduler. Every
# request they count is dropped by abort_all. The prealloc name is the pre-0.5 name of the
# bootstrap queue.
HELD_GAUGES: Final[Mapping[str, str]] = {
    "sglang:num_running_reqs": "running",
    "sglang:num_queue_reqs": "waiting",
    "sglang:num_prefill_bootstrap_queue_reqs": "bootstrap",
    "sglang:num_prefill_prealloc_queue_reqs": "bootstrap",
    "sglang:num_prefill_inflight_queue_reqs": "inflight",
}
# Ranks that repeat the same scheduler's view (tensor/pipeline/expert parallel ranks all report
# the same queues with --enable-metrics-for-all-schedulers); only dp_rank splits the requests.
DUPLICATE_RANK_LABELS: Final = frozenset({"tp_rank", "pp_rank", "moe_ep_rank"})


class AdminCallError(OSError):
    """The abort call did not get a usable answer (refused, timed out, HTTP error)."""


@dataclass(frozen=True)
class Held:
    """Requests a prefill pod held at one moment, by SGLang queue; None = gauge not reported."""

    running: float | None = None
    waiting: float | None = None
    bootstrap: float | None = None
    inflight: float | None = None

    @property
    def total(self) -> int:
        return int(sum(v or 0 for v in (self.running, self.waiting, self.bootstrap, self.inflight)))

    def describe(self) -> str:
        parts = [
            f"{name} {value:g}" if value is not None else f"{name} unknown"
            for name, value in (
                ("running", self.running),
                ("waiting", self.waiting),
                ("bootstrap", self.bootstrap),
                ("inflight", self.inflight),
            )
        ]
        return ", ".join(parts)


@dataclass(frozen=True)
class AbortReport:
    """What one abort_all did and what it cost."""

    before: Held | None
    after: Held | None
    status: int

    @property
    def aborted(self) -> int:
        """Requests aborted: what the prefill held just before the call (0 if unreadable)."""
        return self.before.total if self.before is not None else 0

    def detail(self, where: str) -> str:
        cost = (
            f"aborted every request it held: {self.aborted} just before ({self.before.describe()})"
            if self.before is not None
            else "aborted every request it held (queue gauges unreadable, count unknown)"
        )
        after = (
            f"; inflight gauge right after: {self.after.inflight:g}"
            if self.after is not None and self.after.inflight is not None
            else ""
        )
        return (
            f"POST {ABORT_PATH} abort_all=true on {where} (HTTP {self.status}): {cost}{after} "
            "(SGLang republishes idle gauges up to 30 s later)"
        )


class PrefillAborter(Protocol):
    """What the remediator needs from an SGLang prefill; tests pass an in-memory fake."""

    async def abort_all(self, base_url: str, token: str | None = None) -> AbortReport: ...


def held_requests(text: str) -> Held:
    """Requests per queue from an SGLang /metrics body.

    Only the `priority=""` total of a queue counts (with priority scheduling each queue is also
    written once per priority); ranks that repeat one scheduler's view count once; dp ranks add.
    """
    wanted = [line for line in text.splitlines() if line.startswith(tuple(HELD_GAUGES))]
    by_queue: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families("\n".join(wanted) + "\n"):
        for s in family.samples:
            queue = HELD_GAUGES.get(s.name)
            if queue is None or s.labels.get("priority", "") != "":
                continue
            key = tuple(
                sorted((k, v) for k, v in s.labels.items() if k not in DUPLICATE_RANK_LABELS)
            )
            seen = by_queue.setdefault(queue, {})
            seen[key] = max(seen.get(key, 0.0), float(s.value))
    return Held(**{q: sum(v.values()) for q, v in by_queue.items()})


class SGLangAdmin:
    """HTTP client for the abort call; a fresh session per call (repairs are rare)."""

    def __init__(self, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.timeout = aiohttp.ClientTimeout(total=timeout)

    async def abort_all(self, base_url: str, token: str | None = None) -> AbortReport:
        """`token`: SGLang's --admin-api-key, sent as a Bearer token (SGLang 0.5.23,
        srt/utils/auth.py: /abort_request is ADMIN_OPTIONAL, so it needs the key once the
        server has one); a PDRemediationPolicy reads it from spec.adminTokenSecretRef."""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with aiohttp.ClientSession(timeout=self.timeout) as session:
            before = await self._held(session, base_url)
            try:
                async with session.post(
                    base_url + ABORT_PATH, json={"rid": "", "abort_all": True}, headers=headers
                ) as resp:
                    if resp.status != 200:
                        text = (await resp.content.read(MAX_ERROR_BODY)).decode(errors="replace")
                        raise AdminCallError(
                            f"{base_url}{ABORT_PATH}: HTTP {resp.status}: {text.strip()}"
                            + _auth_hint(resp.status)
                        )
                    status = resp.status
            except (aiohttp.ClientError, TimeoutError) as e:
                raise AdminCallError(f"{base_url}{ABORT_PATH}: {type(e).__name__}: {e}") from None
            after = await self._held(session, base_url)
        return AbortReport(before=before, after=after, status=status)

    async def _held(self, session: aiohttp.ClientSession, base_url: str) -> Held | None:
        """The queue gauges, or None if they cannot be read (the abort goes ahead anyway)."""
        try:
            async with session.get(base_url + METRICS_PATH) as resp:
                body = await _read_capped(resp.content, MAX_METRICS_BODY)
                if resp.status != 200 or body is None:
                    return None
            return await asyncio.to_thread(held_requests, body.decode("utf-8", errors="replace"))
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None


async def _read_capped(stream: aiohttp.StreamReader, cap: int) -> bytes | None:
    """The whole body, or None if it is larger than `cap` bytes."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in stream.iter_chunked(64 * 1024):
        size += len(chunk)
        if size > cap:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def _auth_hint(status: int) -> str:
    if status in (401, 403):
        return (
            " (the server runs with --api-key or --admin-api-key; /abort_request then needs that "
            "key: a PDRemediationPolicy names it in spec.adminTokenSecretRef, a PDDeployment "
            "does not hold it)"
        )
    return ""
