"""What every part of the prefill worker shares: the room table, the peers, the per-room work.

Why a module of its own: admission, the forward pass, the transfer threads, the settle loop and
the decode peers each own one step of a room's life, but they all read and write the same few
maps, under one lock, from the event loop and from threads. Keeping those maps (and the records
in them) here, with no behaviour beyond waking the settle loop, lets each step live in a module
of its own without any of them owning the others' data.

Threads: `lock` guards `peers`, `bindings`, `pending_bindings`, `work` and the counters in each
`RoomWork`; the room table has its own lock. Transfer and compute threads reach the event loop
only through `wake_settle` (call_soon_threadsafe).
"""

from __future__ import annotations

import asyncio
import builtins
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from pdworker.compute import compute_executor
from pdworker.config import WorkerConfig
from pdworker.metrics import WorkerMetrics
from pdworker.model import KVPool, TinyModel
from pdworker.ordering import Fence, Ordering
from pdworker.rooms import Peer, RoomTable
from pdworker.transfer import Transport

log = logging.getLogger(__name__)


@dataclass
class DecodePeer:
    agent: str
    peer: Peer
    num_pages: int
    last_seen: float
    dead: bool = False


@dataclass
class Binding:
    agent: str
    pages: list[int]
    at: float


@dataclass
class ChunkJob:
    room: int
    index: int
    total: int
    local_pages: list[int]
    remote_pages: list[int]
    fence: Fence  # passed once the kernels that wrote local_pages have finished
    queued: bool = True  # counted in RoomWork.pending (until it moves to RoomWork.writing)


@dataclass
class RoomWork:
    """Prefill bookkeeping for one room (kept in PrefillState.work)."""

    ids: list[int]
    pending: int = 0  # chunk jobs queued for a transfer thread, not yet posted
    writing: int = 0  # chunk writes touching decode memory right now (posted, not released)
    forward_started: bool = False
    forward_done: bool = False
    chunks_done: int = 0
    bytes: int = 0
    # Wire time (pdworker_kv_transfer_seconds on prefill): the seconds during which at least one
    # of the room's WRITEs was posted and not yet released. Gaps in which the room only waited
    # for its own next chunk's forward are not transfer time; they are in forward_seconds.
    on_wire: int = 0
    wire_since: float = 0.0
    wire_seconds: float = 0.0
    forward_seconds: float = 0.0  # compute-thread time of this room's chunks (forward, scatter)
    slot: asyncio.Event = field(default_factory=asyncio.Event)  # a chunk of the room finished
    # One fence per computed chunk (appended by the compute thread, under PrefillState.lock).
    # The room's pages are freed only once all have passed: a failed room skips its queued
    # WRITEs without waiting for their fences, and `forward_done` means the Python calls
    # returned, not that the device finished the kernels they launched.
    fences: list[Fence] = field(default_factory=list)
    meta: builtins.bytes | None = None  # set with the last chunk: first token and KV checksum
    decode_aborted: bool = False
    result: dict[str, Any] = field(default_factory=dict)


class PrefillState:
    """The shared maps and the parts every step needs (config, model, pool, transport)."""

    def __init__(
        self, cfg: WorkerConfig, model: TinyModel, pool: KVPool, transport: Transport
    ) -> None:
        self.cfg = cfg
        self.model = model
        self.pool = pool
        self.transport = transport
        self.legacy = cfg.faults.legacy_status_race
        deadlines: dict[str, float | None] = {
            "bootstrap": cfg.bootstrap_timeout,
            "inflight": None if cfg.faults.no_inflight_watchdog else cfg.inflight_timeout,
        }
        self.table = RoomTable("prefill", deadlines=deadlines, legacy=self.legacy)
        self.metrics = WorkerMetrics("prefill", cfg.incarnation, self.table, pool.pages)
        self.peers: dict[str, DecodePeer] = {}
        self.bindings: dict[int, Binding] = {}
        self.pending_bindings: dict[int, Binding] = {}
        self.waiters: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.work: dict[int, RoomWork] = {}
        self.lock = threading.Lock()  # guards bindings/peers/work counters across threads
        self.tasks: set[asyncio.Task[Any]] = set()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.stopping = False
        self.ordering = Ordering(pool.device)
        self.compute: ThreadPoolExecutor = compute_executor(cfg.compute_threads, pool.device)
        self.wake = asyncio.Event()  # a room may be ready to settle

    def spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def wake_settle(self, work: RoomWork | None = None) -> None:
        """(any thread) a room may be ready to settle; `work`: one of its chunks ended."""
        if self.loop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self._woken, work)

    def _woken(self, work: RoomWork | None) -> None:
        self.wake.set()
        if work is not None:
            work.slot.set()

    def transport_busy(self, agent: str) -> bool:
        """Whether a WRITE into `agent`'s memory is posted and not yet released."""
        with self.lock:
            return any(
                w.writing
                for r, w in self.work.items()
                if (b := self.bindings.get(r)) and b.agent == agent
            )
