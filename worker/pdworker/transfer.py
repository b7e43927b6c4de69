"""The KV transport: a small interface, and its NIXL (UCX) implementation.

Why an interface: the worker logic should not care whether bytes move over NIXL or something a
test substitutes. The NIXL adapter follows the rules learned from SGLang's and NIXL's bugs: pools
are registered once, descriptor lists are prepared once per peer, every `check_xfer_state` poll
has a deadline, handles are always released, and a peer is removed only after the handles that
reference its descriptors are gone. Nothing from the network is unpickled: peers send plain page
geometry and this module builds the descriptors locally.
"""

from __future__ import annotations

import importlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

# A WRITE of a 2 MiB chunk takes ~0.4 ms on this hardware; polling its state less often than
# this would idle the transfer (bench/kv_transfer measured the old 2 ms cap at ~0.5x raw NIXL).
MAX_POLL_PAUSE_S = 0.0002
log = logging.getLogger(__name__)


class TransferError(Exception):
    """A transfer failed; `peer_lost` says the peer itself is gone (remote disconnect)."""

    def __init__(self, message: str, *, peer_lost: bool = False) -> None:
        super().__init__(message)
        self.peer_lost = peer_lost


class Transport(Protocol):
    name: str

    def metadata(self) -> bytes: ...

    def add_peer(
        self, agent: str, metadata: bytes, page_descs: list[tuple[int, int, int]], mem_type: str
    ) -> None: ...

    def remove_peer(self, agent: str) -> None: ...

    def write(
        self,
        agent: str,
        local_pages: list[int],
        remote_pages: list[int],
        notif: bytes,
        timeout: float,
    ) -> None: ...

    def notify(self, agent: str, message: bytes) -> None: ...

    def poll_notifs(self) -> dict[str, list[bytes]]: ...

    def close(self) -> None: ...


class NixlTransport:
    """NIXL agent with the UCX backend; one per process incarnation (the name says which)."""

    def __init__(
        self,
        name: str,
        pool_tensor: Any,
        local_descs: list[tuple[int, int, int]],
        mem_type: str,
        backend: str = "UCX",
    ) -> None:
        bindings = importlib.import_module("nixl_cu12._bindings")
        from nixl_cu12._api import nixl_agent, nixl_agent_config, nixl_thread_sync_t

        logging.getLogger("NIXL").setLevel(logging.WARNING)
        self._bindings = bindings
        self.name = name
        self.mem_type = mem_type
        config = nixl_agent_config(
            backends=[backend], sync_mode=nixl_thread_sync_t.NIXL_THREAD_SYNC_STRICT, num_threads=0
        )
        self._agent = nixl_agent(name, config)
        self._reg = self._agent.register_memory(pool_tensor)
        self._local = self._agent.prep_xfer_dlist("NIXL_INIT_AGENT", local_descs, mem_type)
        self._lock = threading.Lock()
        self._remote: dict[str, Any] = {}
        self._handles: dict[str, int] = {}  # live transfer handles per peer

    def metadata(self) -> bytes:
        return bytes(self._agent.get_agent_metadata())

    def add_peer(
        self, agent: str, metadata: bytes, page_descs: list[tuple[int, int, int]], mem_type: str
    ) -> None:
        with self._lock:
            if agent in self._remote:
                return
        loaded = self._agent.add_remote_agent(metadata)
        loaded_name = loaded.decode() if isinstance(loaded, bytes) else str(loaded)
        if loaded_name != agent:
            self._agent.remove_remote_agent(loaded_name)
            raise TransferError(f"metadata names agent {loaded_name!r}, expected {agent!r}")
        prepped = self._agent.prep_xfer_dlist(agent, page_descs, mem_type)
        with self._lock:
            self._remote[agent] = prepped
            self._handles.setdefault(agent, 0)

    def peer_busy(self, agent: str) -> bool:
        with self._lock:
            return self._handles.get(agent, 0) > 0

    def remove_peer(self, agent: str) -> None:
        """Forget a peer; callers make sure no transfer to it is still in flight."""
        with self._lock:
            prepped = self._remote.pop(agent, None)
            self._handles.pop(agent, None)
        if prepped is None:
            return
        # A dead peer may refuse a clean goodbye; that must not stop the cleanup.
        _quietly(f"releasing descriptors of {agent}", self._agent.release_dlist_handle, prepped)
        _quietly(f"removing peer {agent}", self._agent.remove_remote_agent, agent)

    def write(
        self,
        agent: str,
        local_pages: list[int],
        remote_pages: list[int],
        notif: bytes,
        timeout: float,
    ) -> None:
        with self._lock:
            remote = self._remote.get(agent)
            if remote is None:
                raise TransferError(f"unknown peer {agent}", peer_lost=True)
            self._handles[agent] = self._handles.get(agent, 0) + 1
        deadline = time.monotonic() + timeout
        handle = None
        try:
            handle = self._agent.make_prepped_xfer(
                "WRITE", self._local, local_pages, remote, remote_pages, notif
            )
            state = self._agent.transfer(handle)
            pause = 0.00005
            while state == "PROC":
                if time.monotonic() > deadline:
                    raise TransferError(f"transfer to {agent} stalled for {timeout:g}s")
                time.sleep(pause)
                pause = min(pause * 2, MAX_POLL_PAUSE_S)
                state = self._agent.check_xfer_state(handle)
            if state != "DONE":
                raise TransferError(f"transfer to {agent} ended in state {state}")
        except self._bindings.nixlRemoteDisconnectError as exc:
            raise TransferError(f"peer {agent} disconnected: {exc}", peer_lost=True) from exc
        except TransferError:
            raise
        except Exception as exc:
            raise TransferError(f"transfer to {agent} failed: {type(exc).__name__}: {exc}") from exc
        finally:
            if handle is not None:
                try:
                    self._agent.release_xfer_handle(handle)
                except Exception as exc:
                    log.warning("could not release a transfer handle to %s: %s", agent, exc)
            with self._lock:
                if agent in self._handles:
                    self._handles[agent] -= 1

    def notify(self, agent: str, message: bytes) -> None:
        try:
            self._agent.send_notif(agent, message)
        except Exception as exc:
            raise TransferError(f"notification to {agent} failed: {exc}") from exc

    def poll_notifs(self) -> dict[str, list[bytes]]:
        return dict(self._agent.get_new_notifs())

    def close(self) -> None:
        for agent in list(self._remote):
            self.remove_peer(agent)
        _quietly("releasing local descriptors", self._agent.release_dlist_handle, self._local)
        _quietly("deregistering the KV pool", self._agent.deregister_memory, self._reg)


def _quietly(what: str, call: Callable[[Any], object], arg: Any) -> None:
    try:
        call(arg)
    except Exception as exc:
        log.warning("%s: %s", what, exc)
