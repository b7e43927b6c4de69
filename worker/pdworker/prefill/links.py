"""Prefill's side of the decode links: registration, room binding, aborts, heartbeats, loss.

Why a module of its own: these are the calls the bootstrap server makes with input it has already
validated (`handshake`), and the rules that keep one decode from acting for another. A peer is
bound to the TCP address it registered from (`_caller_owns`), the number and size of live peers
are bounded before NIXL sees any metadata, loading metadata runs on a thread with a bounded queue,
and a new incarnation at the same verified address replaces the old one only once its metadata
loaded (then the old one's rooms fail as `peer_lost`). The first decode to bind a room owns it.
An abort from decode is acknowledged only once no WRITE into its pages is in flight. A decode
that stops heart-beating (`check`, from the settle loop) or that NIXL reports gone is lost: its
rooms fail at once, and its NIXL entry is removed once no WRITE to it is in flight.
"""

from __future__ import annotations

import asyncio
import logging
import time

from pdworker import limits
from pdworker.handshake import PeerRegistration, Refused
from pdworker.prefill.admission import Admission
from pdworker.prefill.state import Binding, DecodePeer, PrefillState
from pdworker.rooms import Peer
from pdworker.server import wait_until
from pdworker.transfer import TransferError

log = logging.getLogger(__name__)
mono = time.monotonic


class DecodeLinks:
    def __init__(self, state: PrefillState, admission: Admission) -> None:
        self.s = state
        self.admission = admission
        self.registering: set[str] = set()  # agents whose NIXL metadata is being loaded
        self.slots = asyncio.Semaphore(limits.PEER_REGISTRATIONS_AT_ONCE)

    def _caller_owns(self, agent: str, caller_ip: str) -> DecodePeer | None:
        """(under the lock) the peer `agent` if it exists; Refused (403) if it was registered
        from elsewhere."""
        known = self.s.peers.get(agent)
        if known is not None and known.peer.ip != caller_ip:
            raise Refused(403, "this agent was registered from another address")
        return known

    async def register_peer(self, reg: PeerRegistration) -> None:
        """Load a decode's NIXL metadata; only once that worked, replace an older incarnation
        at the same (verified) address and fail its rooms."""
        s = self.s
        with s.lock:
            known = self._caller_owns(reg.agent, reg.ip)
            if known is not None and not known.dead:
                known.last_seen = mono()
                return
            live = [p for p in s.peers.values() if not p.dead]
            if len(live) >= limits.MAX_DECODE_PEERS:
                raise Refused(429, f"prefill serves {limits.MAX_DECODE_PEERS} decode peers already")
            if sum(p.num_pages for p in live) + reg.num_pages > limits.MAX_TOTAL_PEER_PAGES:
                raise Refused(429, "decode peers' KV pools exceed what this prefill describes")
            if reg.agent in self.registering:
                raise Refused(409, "this agent is being registered already; retry")
            if len(self.registering) >= limits.PEER_REGISTRATIONS_QUEUED:
                raise Refused(429, "too many decode registrations at once; retry")
            self.registering.add(reg.agent)
        try:
            async with self.slots:
                try:
                    await asyncio.to_thread(self._load, reg)
                except TransferError as exc:
                    raise Refused(400, str(exc), reason="transfer_error") from exc
            peer = Peer(reg.pod_hint, reg.address, reg.incarnation, reg.ip)
            with s.lock:
                replaced = [
                    a
                    for a, p in s.peers.items()
                    if a != reg.agent and p.peer.address == reg.address and not p.dead
                ]
                s.peers[reg.agent] = DecodePeer(reg.agent, peer, reg.num_pages, mono())
        finally:
            with s.lock:
                self.registering.discard(reg.agent)
        for other in replaced:
            self.lost(other, f"replaced by new incarnation {reg.incarnation}")
        log.info("registered decode peer %s (%s)", reg.agent, reg.address)

    def _load(self, reg: PeerRegistration) -> None:
        """Build the descriptors and hand NIXL the metadata (a thread: both can be slow)."""
        descs = reg.page_descs()
        try:
            self.s.transport.add_peer(reg.agent, reg.metadata, descs, reg.mem_type)
        except TransferError:
            raise
        except Exception as exc:
            if type(exc).__module__.startswith("nixl"):  # NIXL refused the bytes: bad input
                raise TransferError(f"NIXL refused the metadata: {type(exc).__name__}") from exc
            raise

    def register_room(self, agent: str, caller_ip: str, room: int, pages: list[int]) -> str:
        """Attach decode's pages to a room: "bound", or "pending" until prefill sees the
        request. The first decode to bind a room owns it; nobody else can re-bind it."""
        s, now = self.s, mono()
        with s.lock:
            peer = self._caller_owns(agent, caller_ip)
            if peer is None or peer.dead:
                raise Refused(409, "unknown decode peer; register first", reason="peer_lost")
            if any(p >= peer.num_pages for p in pages):
                raise Refused(400, "decode page index out of range", reason="transfer_error")
            peer.last_seen = now
            owner = s.bindings.get(room) or s.pending_bindings.get(room)
            if owner is not None and owner.agent != agent:
                raise Refused(409, "room is bound to another decode", reason="aborted")
            if room in s.bindings:
                raise Refused(409, "room already registered", reason="aborted")
            if room not in s.work:
                if owner is None:
                    if len(s.pending_bindings) >= limits.MAX_PENDING_BINDINGS:
                        raise Refused(429, "too many rooms wait for their prefill request")
                    s.pending_bindings[room] = Binding(agent, pages, now)
                return "pending"
        entry = s.table.get(room)
        if entry is None or entry.terminal:
            reason = entry.reason if entry and entry.reason else "aborted"
            raise Refused(410, "room already finished", reason=reason)
        problem = self.admission.bind(room, Binding(agent, pages, now))
        if problem:
            s.table.fail(room, "transfer_error", mono(), problem)
            raise Refused(400, problem, reason="transfer_error")
        return "bound"

    async def abort_from_decode(self, agent: str, caller_ip: str, room: int) -> bool:
        """Decode's ABORT of a room it bound; True once no WRITE into its pages is in flight."""
        s = self.s
        with s.lock:
            self._caller_owns(agent, caller_ip)
            bound, pending = s.bindings.get(room), s.pending_bindings.get(room)
            if bound is not None and bound.agent == agent:
                del s.bindings[room]  # no write may start into decode's pages from now on
            elif pending is not None and pending.agent == agent:
                del s.pending_bindings[room]
            else:
                raise Refused(404, "this decode has no room with that id")
            work = s.work.get(room)
            if work is not None:
                work.decode_aborted = True
        if not s.table.fail(room, "aborted", mono(), "aborted by decode") and work is None:
            s.table.tombstone(room, "aborted", "aborted by decode before prefill saw it")
        # Writes into decode's pages are counted by transfer threads; poll them with a deadline.
        return work is None or await wait_until(
            lambda: not work.writing, s.cfg.transfer_timeout + 1, interval=0.002
        )

    def heartbeat(self, agent: str, caller_ip: str) -> bool:
        """Refresh a live peer; False if this prefill does not know it (decode re-registers)."""
        with self.s.lock:
            peer = self._caller_owns(agent, caller_ip)
            if peer is None or peer.dead:
                return False
            peer.last_seen = mono()
            return True

    def check(self, now: float) -> None:
        """(settle loop) lose silent peers; forget dead ones once no WRITE to them is left."""
        s = self.s
        for agent, peer in list(s.peers.items()):
            if agent in self.registering:
                continue  # being (re-)registered: its NIXL entry is in use
            if not peer.dead and now - peer.last_seen > s.cfg.peer_timeout:
                self.lost(agent, f"no heartbeat for {s.cfg.peer_timeout:g}s")
            if peer.dead and not s.transport_busy(agent):
                with s.lock:
                    s.peers.pop(agent, None)
                s.transport.remove_peer(agent)

    def lost(self, agent: str, why: str) -> None:
        """(event loop) a decode is gone: fail its rooms, drop its early bindings."""
        s, now = self.s, mono()
        with s.lock:
            peer = s.peers.get(agent)
            if peer is None or peer.dead:
                return
            peer.dead = True
            rooms = [r for r, b in s.bindings.items() if b.agent == agent]
            for r in [r for r, b in s.pending_bindings.items() if b.agent == agent]:
                del s.pending_bindings[r]
        log.warning("decode peer %s lost (%s); failing %d rooms", agent, why, len(rooms))
        for room in rooms:
            s.table.fail(room, "peer_lost", now, f"decode {agent} lost: {why}")
