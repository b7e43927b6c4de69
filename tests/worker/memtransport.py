"""An in-memory `Transport` for in-process tests of the worker's data path (no NIXL).

A stand-in only where the real thing cannot show what a test needs to see (the order of fence
waits and WRITE posts, a WRITE that completes late on another thread); the real NIXL path is
covered by the process tests and bench/kv_transfer. Transports on one `Hub` reach each other by
name; a WRITE copies whole pages between the registered pool tensors and delivers its
notification to the target, as NIXL does after the data landed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch

from pdworker.transfer import Done, TransferError


class Hub:
    def __init__(self) -> None:
        self.transports: dict[str, MemoryTransport] = {}
        self.log: list[str] = []  # "submit <agent> <notif>" entries, in order


class MemoryTransport:
    def __init__(
        self, hub: Hub, name: str, pool: torch.Tensor, *, complete_on_thread: bool = True
    ) -> None:
        self.hub = hub
        self.name = name
        self.pool = pool
        self.peers: set[str] = set()
        self.inbox: dict[str, list[bytes]] = {}
        self.lock = threading.Lock()
        self.complete_on_thread = complete_on_thread
        self.before_copy: Callable[[], None] | None = None
        hub.transports[name] = self

    def metadata(self) -> bytes:
        return self.name.encode()

    def add_peer(self, agent: str, metadata: bytes, page_descs: Any, mem_type: str) -> None:
        if metadata.decode() != agent or agent not in self.hub.transports:
            raise TransferError(f"unknown agent {agent}")
        self.peers.add(agent)

    def remove_peer(self, agent: str) -> None:
        self.peers.discard(agent)

    def submit(self, agent: str, local_pages: list[int], remote_pages: list[int], notif: bytes,
               *, timeout: float, done: Done) -> None:  # fmt: skip
        self.hub.log.append(f"submit {agent} {notif.decode()}")
        if agent not in self.peers:
            done(TransferError(f"unknown peer {agent}", peer_lost=True))
            return

        def run() -> None:
            if self.before_copy is not None:
                self.before_copy()
            target = self.hub.transports[agent]
            idx_src = torch.tensor(local_pages, dtype=torch.long)
            idx_dst = torch.tensor(remote_pages, dtype=torch.long)
            target.pool[idx_dst] = self.pool[idx_src]
            target.deliver(self.name, notif)
            done(None)

        if self.complete_on_thread:
            threading.Thread(target=run, daemon=True).start()
        else:
            run()

    def deliver(self, sender: str, message: bytes) -> None:
        with self.lock:
            self.inbox.setdefault(sender, []).append(message)

    def notify(self, agent: str, message: bytes) -> None:
        self.hub.log.append(f"notify {agent} {message.decode()}")
        self.hub.transports[agent].deliver(self.name, message)

    def poll_notifs(self) -> dict[str, list[bytes]]:
        with self.lock:
            out, self.inbox = self.inbox, {}
        return out

    def close(self) -> None:
        self.hub.transports.pop(self.name, None)
