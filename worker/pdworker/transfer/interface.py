"""The KV transport as the worker sees it: a small interface, whatever moves the bytes.

Why an interface: the worker logic should not care whether bytes move over NIXL (`nixl`) or
something a test substitutes (tests/worker/memtransport.py is an in-memory one). The contract
is `submit`: post one WRITE and return at once; `done` is called exactly once, when no part of
the WRITE can touch the pages any more.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Protocol

WRITE_WAIT_GRACE_S = 5.0  # how long past a deadline to wait for a stuck cancel (write, close)


class TransferError(Exception):
    """A transfer failed; `peer_lost` says the peer itself is gone (remote disconnect)."""

    def __init__(self, message: str, *, peer_lost: bool = False) -> None:
        super().__init__(message)
        self.peer_lost = peer_lost


Done = Callable[[TransferError | None], None]


class Transport(Protocol):
    name: str

    def metadata(self) -> bytes: ...

    def add_peer(
        self, agent: str, metadata: bytes, page_descs: list[tuple[int, int, int]], mem_type: str
    ) -> None: ...

    def remove_peer(self, agent: str) -> None: ...

    def submit(
        self,
        agent: str,
        local_pages: list[int],
        remote_pages: list[int],
        notif: bytes,
        *,
        timeout: float,
        done: Done,
    ) -> None:
        """Post one WRITE of `local_pages` into the peer's `remote_pages`; return at once.

        `done(None | TransferError)` is called exactly once (maybe before `submit` returns, maybe
        from another thread) when no part of the WRITE can touch the pages any more.
        """
        ...

    def notify(self, agent: str, message: bytes) -> None: ...

    def poll_notifs(self) -> dict[str, list[bytes]]: ...

    def close(self) -> None: ...


def write_blocking(
    transport: Transport, agent: str, local: list[int], remote: list[int], *, notif: bytes,
    timeout: float,
) -> None:  # fmt: skip
    """`submit` and wait for `done` (with a deadline of its own)."""
    finished = threading.Event()
    outcome: list[TransferError | None] = []

    def done(err: TransferError | None) -> None:
        outcome.append(err)
        finished.set()

    transport.submit(agent, local, remote, notif, timeout=timeout, done=done)
    if not finished.wait(timeout + WRITE_WAIT_GRACE_S):
        raise TransferError(f"transfer to {agent} could not be cancelled after {timeout:g}s")
    if outcome[0] is not None:
        raise outcome[0]
