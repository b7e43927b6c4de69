"""The prefill role: wait for decode's handshake, compute KV in chunks, WRITE it into decode.

Mirrors SGLang's prefill (bootstrap queue -> forward -> inflight queue) with its NIXL bugs fixed:
the bootstrap wait and the inflight queue have deadlines (the watchdog clock starts when a room
enters the inflight queue, so a long prefill is legal), transfers are sharded over threads by
room and every poll has a deadline, decode aborts are acknowledged only after in-flight writes
into decode memory have drained, prefill-side failures are pushed to decode, and a decode that
stops heart-beating or comes back as a new incarnation has its rooms failed (`peer_lost`).
The `legacy-status-race` fault restores SGLang's status race; `no-inflight-watchdog` drops the
inflight deadline.

This module only assembles the parts and is the surface other code calls (the HTTP apps, the
bootstrap server, the operator's admin API); each step of a room's life is a module of its own:
`admission` (a request becomes a room, decode's pages bind it), `forward` (compute, chunk by
chunk), `shards` (transfer threads post each chunk's WRITE), `settle` (deadlines, and ending a
room once nothing touches its pages), `links` (decode peers: handshake, heartbeats, loss), over
the shared maps in `state`.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from aiohttp import web

from pdworker.config import WorkerConfig
from pdworker.handshake import PeerRegistration
from pdworker.model import KVPool, TinyModel
from pdworker.prefill.admission import Admission
from pdworker.prefill.forward import Forward
from pdworker.prefill.links import DecodeLinks
from pdworker.prefill.settle import Settler
from pdworker.prefill.shards import Shards
from pdworker.prefill.state import PrefillState
from pdworker.server import FailSelector, wait_until
from pdworker.transfer import Transport

mono = time.monotonic


class PrefillWorker(PrefillState):
    def __init__(
        self, cfg: WorkerConfig, model: TinyModel, pool: KVPool, transport: Transport
    ) -> None:
        super().__init__(cfg, model, pool, transport)
        # Built bottom-up; a peer NIXL reports gone reaches the links (built later) by _peer_lost.
        self.shards = Shards(self, on_peer_lost=self._peer_lost)
        self.forward = Forward(self, self.shards)
        self.admission = Admission(self, self.forward)
        self.links = DecodeLinks(self, self.admission)
        self.settler = Settler(self, self.links)

    # -- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.shards.start()
        self.spawn(self.settler.loop())

    async def stop(self) -> None:
        self.stopping = True
        now = mono()
        for room in self.table.select(now):
            self.table.fail(room, "aborted", now, "prefill shutting down")
        await wait_until(
            lambda: not any(w.writing for w in list(self.work.values())), self.cfg.transfer_timeout
        )
        self.settler.settle(mono())
        self.shards.stop()
        for task in self.tasks:
            task.cancel()
        self.compute.shutdown(wait=False, cancel_futures=True)
        self.transport.close()

    def ready(self) -> bool:
        return not self.stopping and self.loop is not None

    def _peer_lost(self, agent: str, why: str) -> None:
        self.links.lost(agent, why)

    # -- serving (POST /generate) --------------------------------------------------------
    async def handle_generate(self, request: web.Request) -> web.StreamResponse:
        return await self.admission.handle_generate(request)

    # -- admin API (server.AdminTarget) --------------------------------------------------
    def list_rooms(self) -> list[dict[str, Any]]:
        now = mono()
        return [r.as_dict(now) for r in self.table.snapshot()]

    async def fail_rooms(self, selector: FailSelector) -> list[int]:
        now = mono()
        rooms = self.table.select(
            now,
            rooms=selector.rooms,
            older_than=selector.older_than_seconds,
            peer_incarnation=selector.peer_incarnation,
        )
        return [r for r in rooms if self.table.fail(r, "admin", now, "failed by the admin API")]

    # -- the handshake (the bootstrap server calls these with validated input) ------------
    async def register_peer(self, reg: PeerRegistration) -> None:
        await self.links.register_peer(reg)

    def register_room(self, agent: str, caller_ip: str, room: int, pages: list[int]) -> str:
        return self.links.register_room(agent, caller_ip, room, pages)

    async def abort_from_decode(self, agent: str, caller_ip: str, room: int) -> bool:
        return await self.links.abort_from_decode(agent, caller_ip, room)

    def heartbeat(self, agent: str, caller_ip: str) -> bool:
        return self.links.heartbeat(agent, caller_ip)
