"""The per-room KVPoll state machine, shared by prefill and decode, with no I/O.

Why a separate pure module: every production wedge we reproduce is a state-machine bug (a late
Transferring write resurrecting a Failed room, a cleared room re-created by a late write, a wait
without a deadline). Keeping the machine pure lets hypothesis drive arbitrary interleavings of
transfer, abort, timeout and clear events against it, while the worker calls exactly this code.

Correct mode: statuses only move forward, Failed and Success are terminal, a write to an unknown
(cleared) room is ignored, every failure carries a reason from contract.FAILURE_REASONS, and every
waiting phase has a deadline enforced by `expire`. Legacy mode (`legacy-status-race`) reproduces
SGLang's `update_status`: writes take max(old, new), Failed overrides anything but is not sticky,
and a write to an unknown room re-creates it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pdworker.contract import (
    FAILURE_REASONS,
    ROOM_PEER_POD_HINT,
    ROOM_PEER_VERIFIED_IP,
    KVPoll,
)

TERMINAL = frozenset({KVPoll.Failed, KVPoll.Success})

# The reason a room fails with when it overstays a waiting phase.
PHASE_TIMEOUT_REASON: Mapping[str, str] = {
    "bootstrap": "bootstrap_timeout",
    "inflight": "inflight_timeout",
    "prealloc": "waiting_timeout",
    "transfer": "waiting_timeout",
}
TOMBSTONE_LIMIT = 65536


class RoomRejected(Exception):
    """A room cannot be created: it exists, or it already failed before it was created here."""

    def __init__(self, room: int, reason: str, detail: str) -> None:
        super().__init__(f"room {room}: {detail}")
        self.room = room
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class Peer:
    """The other side of a room: which pod, where, and which process incarnation.

    `ip` is what this worker verified (the TCP peer of an authenticated handshake); `pod` is the
    peer's own word, a hint for people that must never choose whom the operator acts on.
    """

    pod: str
    address: str
    incarnation: str
    ip: str = ""

    def as_dict(self) -> dict[str, str]:
        return {
            ROOM_PEER_POD_HINT: self.pod,
            "address": self.address,
            "incarnation": self.incarnation,
            ROOM_PEER_VERIFIED_IP: self.ip,
        }


@dataclass
class Room:
    room: int
    role: str
    status: KVPoll
    phase: str
    created_at: float
    phase_since: float
    peer: Peer | None = None
    reason: str | None = None
    detail: str = ""
    data: dict[str, Any] = field(default_factory=dict)  # role-specific bookkeeping

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    def as_dict(self, now: float) -> dict[str, Any]:
        return {
            "room": self.room,
            "role": self.role,
            "state": self.status.name,
            "phase": self.phase,
            "age_seconds": round(now - self.created_at, 3),
            "phase_seconds": round(now - self.phase_since, 3),
            "peer": self.peer.as_dict() if self.peer else None,
            "reason": self.reason,
        }


class RoomTable:
    """All live rooms of one worker; thread-safe (transfer threads write statuses too)."""

    def __init__(
        self,
        role: str,
        *,
        deadlines: Mapping[str, float | None] | None = None,
        legacy: bool = False,
    ) -> None:
        self.role = role
        self.legacy = legacy
        self.deadlines: dict[str, float | None] = dict(deadlines or {})
        self._lock = threading.RLock()
        self._rooms: dict[int, Room] = {}
        self._tombstones: OrderedDict[int, tuple[str, str]] = OrderedDict()

    # -- creation and lookup -------------------------------------------------------------
    def create(self, room: int, phase: str, now: float, peer: Peer | None = None) -> Room:
        with self._lock:
            if room in self._rooms:
                raise RoomRejected(room, "duplicate", "room already exists")
            tomb = self._tombstones.pop(room, None)
            if tomb is not None:
                raise RoomRejected(room, tomb[0], f"room already failed: {tomb[1]}")
            entry = Room(room, self.role, KVPoll.Bootstrapping, phase, now, now, peer=peer)
            self._rooms[room] = entry
            return entry

    def get(self, room: int) -> Room | None:
        with self._lock:
            return self._rooms.get(room)

    def status(self, room: int) -> KVPoll | None:
        with self._lock:
            entry = self._rooms.get(room)
            return entry.status if entry else None

    def __len__(self) -> int:
        with self._lock:
            return len(self._rooms)

    def snapshot(self) -> list[Room]:
        with self._lock:
            return list(self._rooms.values())

    # -- transitions ---------------------------------------------------------------------
    def update(self, room: int, status: KVPoll, now: float) -> KVPoll | None:
        """Write a non-failure status; returns the status after the write (None: no room)."""
        if status == KVPoll.Failed:
            raise ValueError("use fail(room, reason): every failure needs a reason")
        with self._lock:
            entry = self._rooms.get(room)
            if entry is None:
                if not self.legacy:
                    return None  # a cleared room is never re-created by a late write
                # SGLang: an unknown room is simply set, so a late write resurrects a cleared room.
                entry = Room(room, self.role, status, "inflight", now, now)
                entry.detail = "re-created by a late status write"
                self._rooms[room] = entry
                return status
            if entry.terminal and not self.legacy:
                return entry.status
            entry.status = KVPoll(max(entry.status, status))
            return entry.status

    def fail(self, room: int, reason: str, now: float, detail: str = "") -> bool:
        """Fail a room; True only for the call that made it fail (idempotent otherwise)."""
        if reason not in FAILURE_REASONS:
            raise ValueError(f"unknown failure reason {reason!r}")
        with self._lock:
            entry = self._rooms.get(room)
            if entry is None:
                return False
            if entry.terminal and not self.legacy:
                return False
            if entry.status == KVPoll.Failed:
                return False
            entry.status = KVPoll.Failed
            entry.reason = reason
            entry.detail = detail or reason
            return True

    def set_phase(self, room: int, phase: str, now: float) -> bool:
        with self._lock:
            entry = self._rooms.get(room)
            if entry is None:
                return False
            entry.phase = phase
            entry.phase_since = now
            return True

    def bind(self, room: int, peer: Peer) -> bool:
        with self._lock:
            entry = self._rooms.get(room)
            if entry is None or entry.terminal:
                return False
            entry.peer = peer
            return True

    def clear(self, room: int) -> Room | None:
        """Forget a terminal room (a failed one leaves a tombstone so it is not re-created)."""
        with self._lock:
            entry = self._rooms.pop(room, None)
            if entry is not None and entry.status == KVPoll.Failed:
                self.tombstone(room, entry.reason or "aborted", entry.detail)
            return entry

    def tombstone(self, room: int, reason: str, detail: str) -> None:
        """Remember that a room failed before (or after) it existed here, e.g. an early abort."""
        with self._lock:
            self._tombstones[room] = (reason, detail)
            self._tombstones.move_to_end(room)
            while len(self._tombstones) > TOMBSTONE_LIMIT:
                self._tombstones.popitem(last=False)

    def expire(self, now: float) -> list[Room]:
        """Fail every non-terminal room that overstayed its phase's deadline."""
        failed = []
        with self._lock:
            for entry in self._rooms.values():
                if entry.terminal:
                    continue
                limit = self.deadlines.get(entry.phase)
                if limit is None or now - entry.phase_since <= limit:
                    continue
                reason = PHASE_TIMEOUT_REASON[entry.phase]
                detail = f"timed out after {limit:g}s in phase {entry.phase} ({entry.status.name})"
                if self.fail(entry.room, reason, now, detail):
                    failed.append(entry)
        return failed

    # -- queries for metrics and the admin API -------------------------------------------
    def count(self, phase: str) -> int:
        with self._lock:
            return sum(1 for r in self._rooms.values() if r.phase == phase)

    def oldest(self, phase: str, now: float) -> float:
        with self._lock:
            ages = [now - r.phase_since for r in self._rooms.values() if r.phase == phase]
        return max(ages, default=0.0)

    def select(
        self,
        now: float,
        *,
        rooms: Iterable[int] | None = None,
        older_than: float | None = None,
        peer_incarnation: str | None = None,
    ) -> list[int]:
        """Non-terminal rooms matching an admin/peer-loss selector."""
        wanted = set(rooms) if rooms is not None else None
        with self._lock:
            out = []
            for r in self._rooms.values():
                if r.terminal:
                    continue
                if wanted is not None and r.room not in wanted:
                    continue
                if older_than is not None and now - r.created_at < older_than:
                    continue
                if peer_incarnation is not None and (
                    r.peer is None or r.peer.incarnation != peer_incarnation
                ):
                    continue
                out.append(r.room)
            return out
