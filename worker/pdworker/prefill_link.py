"""Decode's side of the handshake: one `PrefillLink` per prefill bootstrap endpoint.

Registers this decode incarnation with a prefill once (NIXL agent metadata and the KV pool's
geometry as plain data), registers each room's destination pages, sends acknowledged ABORTs, and
heart-beats every known prefill: repeated failures, a new prefill incarnation, or a prefill that
no longer knows this decode all count as losing the peer, and its rooms fail at once instead of
waiting out a timeout.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from pdworker.config import WorkerConfig
from pdworker.contract import FAILURE_REASONS
from pdworker.model import KVPool
from pdworker.transfer import Transport

log = logging.getLogger(__name__)


class PeerError(Exception):
    """Talking to prefill failed; `reason` is the room's failure reason."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


@dataclass
class PrefillLink:
    """What this decode knows about one prefill bootstrap endpoint."""

    address: str
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    registered: bool = False
    incarnation: str = ""
    agent: str = ""
    pod: str = ""
    failures: int = 0


class PrefillLinks:
    def __init__(
        self,
        cfg: WorkerConfig,
        transport: Transport,
        pool: KVPool,
        on_lost: Callable[[str, str], None],
    ) -> None:
        self.cfg = cfg
        self.transport = transport
        self.pool = pool
        self.on_lost = on_lost
        self.links: dict[str, PrefillLink] = {}
        self.session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()

    async def post(
        self, address: str, path: str, body: dict[str, Any], limit_s: float
    ) -> tuple[int, Any]:
        assert self.session is not None
        async with self.session.post(
            f"http://{address}{path}", json=body, timeout=aiohttp.ClientTimeout(total=limit_s)
        ) as resp:
            try:
                data = await resp.json(content_type=None)
            except ValueError:
                data = {}
            return resp.status, data

    async def ensure(self, address: str) -> PrefillLink:
        link = self.links.setdefault(address, PrefillLink(address))
        async with link.lock:
            if link.registered:
                return link
            assert self.session is not None
            try:
                async with self.session.get(
                    f"http://{address}/bootstrap/info", timeout=aiohttp.ClientTimeout(total=5)
                ) as resp:
                    info = await resp.json()
                if info.get("layout") != self.cfg.model.layout():
                    raise PeerError("transfer_error", f"KV layout mismatch with prefill {address}")
                body = {
                    "agent": self.transport.name,
                    "pod": self.cfg.pod,
                    "address": self.cfg.address,
                    "incarnation": self.cfg.incarnation,
                    "metadata": base64.b64encode(self.transport.metadata()).decode(),
                    "layout": self.cfg.model.layout(),
                    "pool": {
                        "base_addr": self.pool.base_addr,
                        "page_bytes": self.cfg.model.page_bytes,
                        "num_pages": self.pool.num_pages,
                        "device_id": self.pool.device_id,
                        "mem_type": self.pool.mem_type,
                    },
                }
                status, data = await self.post(address, "/bootstrap/peer", body, 10)
            except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                raise PeerError("peer_lost", f"prefill {address} unreachable: {exc!r}") from exc
            if status != 200:
                raise PeerError("transfer_error", f"prefill {address} refused registration: {data}")
            link.registered = True
            link.incarnation = str(info.get("incarnation", ""))
            link.agent = str(info.get("agent", ""))
            link.pod = str(info.get("pod", ""))
            link.failures = 0
            return link

    async def register_room(self, link: PrefillLink, room: int, pages: list[int]) -> None:
        body = {"room": room, "agent": self.transport.name, "pages": pages}
        for attempt in range(2):
            try:
                status, data = await self.post(link.address, "/bootstrap/room", body, 5)
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise PeerError(
                    "peer_lost", f"prefill {link.address} unreachable: {exc!r}"
                ) from exc
            if status == 200:
                return
            if status == 409 and data.get("reason") == "peer_lost" and attempt == 0:
                self.lost(link, "prefill does not know this decode")
                link = await self.ensure(link.address)
                continue
            reason = (
                data.get("reason") if data.get("reason") in FAILURE_REASONS else "transfer_error"
            )
            raise PeerError(reason, f"prefill refused room: {data.get('error', status)}")

    async def send_abort(self, address: str, room: int) -> None:
        """ABORT to prefill; returns once prefill acknowledged (its writes drained) or timed out."""
        try:
            await self.post(
                address,
                "/bootstrap/abort",
                {"room": room, "agent": self.transport.name},
                self.cfg.abort_ack_timeout,
            )
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.info("abort of room %d not acknowledged by %s: %r", room, address, exc)

    def lost(self, link: PrefillLink, why: str) -> None:
        """Forget the registration (the next room re-registers) and fail the bound rooms."""
        link.registered = False
        self.on_lost(link.address, why)

    async def heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.heartbeat_interval)
            for link in list(self.links.values()):
                if not link.registered:
                    continue
                try:
                    status, data = await self.post(
                        link.address,
                        "/bootstrap/heartbeat",
                        {"agent": self.transport.name},
                        min(3.0, self.cfg.heartbeat_interval * 2),
                    )
                    if status != 200:
                        raise PeerError("peer_lost", f"heartbeat answered {status}")
                except (aiohttp.ClientError, TimeoutError, PeerError) as exc:
                    link.failures += 1
                    if link.failures >= self.cfg.heartbeat_failures:
                        self.lost(link, f"{link.failures} heartbeats failed ({exc!r})")
                    continue
                link.failures = 0
                if data.get("incarnation") != link.incarnation:
                    self.lost(link, "prefill restarted (new incarnation)")
                elif not data.get("known"):
                    self.lost(link, "prefill dropped this decode")
