"""The KV transport's NIXL (UCX) adapter, shaped the way the hardware wants it.

It follows the rules learned from SGLang's and NIXL's bugs:

* pools are registered once and descriptor lists prepared once per peer (one descriptor per
  page); a chunk is ONE WRITE over all its pages, selected by index lists (NIXL merges
  contiguous descriptors itself), never one WRITE per page;
* `submit` posts and returns: many WRITEs (chunks of one room, and rooms) are in flight at once;
  one progress thread polls every live handle round after round (no back-off) and calls each
  handle's `done` exactly once, after the handle is released, so the caller may reuse the pages;
* that thread is also the only one that progresses UCX: NIXL's own progress thread is off, since
  the Python API hard-codes its poll delay to 0 ms and it spins a core per agent even when idle
  (measured: 2.0 CPU-seconds per 3 s idle, four fifths in the kernel; prefill plus decode took
  1.3 of this machine's 2 cores doing nothing). Between rounds, and every few milliseconds when
  idle, the thread drains NIXL's notifications into a bounded buffer that `poll_notifs` hands
  over, so no UCX call runs on the caller's event loop;
* every handle has a deadline; on expiry it is cancelled (released); a handle NIXL refuses to
  release is retried and its `done` held back, because its WRITE may still read the pages;
* a peer is removed only after the handles that reference its descriptors are gone;
* nothing from the network is unpickled: peers send plain page geometry and the descriptors are
  built here.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from pdworker.nixl_loader import load_nixl
from pdworker.transfer.interface import WRITE_WAIT_GRACE_S, Done, TransferError

log = logging.getLogger(__name__)
# Between polling rounds in which no handle finished, the progress thread only yields the GIL
# (no sleep, no back-off) where cores are plenty; on small hosts (the 2-core CI box) a thread that
# never sleeps steals the event loop's core: a fixed 100 us pause there measured endpoint p99
# under the kv_storm bench 94-109 ms against 143-154 ms spinning (noisy, load 8-11).
PROGRESS_PAUSE_S = 0.0 if (os.cpu_count() or 1) >= 4 else 0.0001
RELEASE_RETRY_S = 0.01  # a handle NIXL refused to release (cannot cancel) is retried this often
# How often the progress thread drains notifications (and so progresses UCX for incoming
# messages, connection set-up and, on TCP, incoming data): every DRAIN_ACTIVE_S for a while after
# any traffic, DRAIN_QUIET_S otherwise. Measured idle cost of a 1 ms drain: ~2 % of a core.
DRAIN_ACTIVE_S = 0.001
DRAIN_QUIET_S = 0.01
ACTIVE_WINDOW_S = 1.0  # traffic (a live handle or a notification) keeps the fast pace this long
# Notifications buffered for `poll_notifs`; past this the thread stops draining (NIXL keeps the
# rest, nothing is lost) until the owner has read them.
MAX_BUFFERED_NOTIFS = 1 << 16


@dataclass
class _Live:
    agent: str
    handle: Any
    deadline: float
    timeout: float
    done: Done
    known: bool = False  # the outcome (error or None) is known; only the release is pending
    error: TransferError | None = None
    next_release: float = 0.0


def make_agent(name: str, backend: str = "UCX") -> Any:
    """A NIXL agent as pdworker runs one (the bench's raw peers too): NIXL's own progress
    thread off (see the module docstring), thread-safe calls, one backend."""
    api = load_nixl().api
    config = api.nixl_agent_config(
        enable_prog_thread=False, backends=[backend], num_threads=0,
        sync_mode=api.nixl_thread_sync_t.NIXL_THREAD_SYNC_STRICT,
    )  # fmt: skip
    return api.nixl_agent(name, config)


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
        nixl = load_nixl()
        logging.getLogger("NIXL").setLevel(logging.WARNING)
        self.nixl_module = nixl.module
        self._bindings = nixl.bindings
        self.name = name
        self.mem_type = mem_type
        agent = make_agent(name, backend)
        self._pool = pool_tensor  # registered memory must outlive its registration
        self._reg = agent.register_memory(pool_tensor)
        local = agent.prep_xfer_dlist(
            "NIXL_INIT_AGENT", np.asarray(local_descs, dtype=np.uint64).reshape(-1, 3), mem_type
        )
        self._start(agent, local)

    def _start(self, agent: Any, local: Any) -> None:
        """Handle bookkeeping and the progress thread (tests start it with a fake agent)."""
        self._agent = agent
        self._local = local
        self._lock = threading.Lock()
        self._remote: dict[str, Any] = {}
        self._handles: dict[str, int] = {}  # live transfer handles per peer
        self._live: list[_Live] = []
        self._wake = threading.Condition(self._lock)
        self._closed = False
        self._notifs: dict[str, list[bytes]] = {}
        self._notif_count = 0
        self._next_drain = 0.0
        self._active_until = 0.0
        self._drain_failed = False
        self._progress = threading.Thread(target=self._progress_main, name="nixl-progress",
                                          daemon=True)  # fmt: skip
        self._progress.start()

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
        descs = np.asarray(page_descs, dtype=np.uint64).reshape(-1, 3)
        prepped = self._agent.prep_xfer_dlist(agent, descs, mem_type)
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
        if len(local_pages) != len(remote_pages) or not local_pages:
            done(TransferError(f"bad page lists ({len(local_pages)} -> {len(remote_pages)})"))
            return
        with self._lock:
            remote = self._remote.get(agent)
            closed = self._closed
            if remote is not None and not closed:
                self._handles[agent] = self._handles.get(agent, 0) + 1
        if closed:
            done(TransferError("transport closed"))
            return
        if remote is None:
            done(TransferError(f"unknown peer {agent}", peer_lost=True))
            return
        live = _Live(agent, None, time.monotonic() + timeout, timeout, done)
        try:
            live.handle = self._agent.make_prepped_xfer(
                "WRITE",
                self._local,
                np.asarray(local_pages, dtype=np.int32),
                remote,
                np.asarray(remote_pages, dtype=np.int32),
                notif,
            )
            state = self._agent.transfer(live.handle)
        except Exception as exc:
            self._complete(live, self._error(agent, exc))
            return
        if state == "PROC":
            self._track(live)
            return
        self._complete(live, None if state == "DONE" else self._state_error(agent, state))

    # -- completion ----------------------------------------------------------------------
    def _error(self, agent: str, exc: Exception) -> TransferError:
        if isinstance(exc, TransferError):
            return exc
        if isinstance(exc, self._bindings.nixlRemoteDisconnectError):
            return TransferError(f"peer {agent} disconnected: {exc}", peer_lost=True)
        return TransferError(f"transfer to {agent} failed: {type(exc).__name__}: {exc}")

    @staticmethod
    def _state_error(agent: str, state: str) -> TransferError:
        return TransferError(f"transfer to {agent} ended in state {state}")

    def _release(self, live: _Live) -> bool:
        """The one release path: release the handle, then report its known outcome once.

        False if NIXL refused the release (the WRITE may still read the pages): the handle stays
        live, `done` is held back and the progress thread retries after RELEASE_RETRY_S.
        """
        if live.handle is not None:
            try:
                self._agent.release_xfer_handle(live.handle)
            except Exception as exc:
                log.warning("could not release a transfer handle to %s (retrying): %s",
                            live.agent, exc)  # fmt: skip
                live.next_release = time.monotonic() + RELEASE_RETRY_S
                return False
            live.handle = None
        with self._lock:
            if live.agent in self._handles:
                self._handles[live.agent] -= 1
        try:
            live.done(live.error)
        except Exception:
            log.exception("transfer completion callback for %s crashed", live.agent)
        return True

    def _complete(self, live: _Live, error: TransferError | None) -> None:
        """(posting thread) the outcome is known at once: release now, or leave it to retry."""
        live.known, live.error = True, error
        if not self._release(live):
            self._track(live)

    def _track(self, live: _Live) -> None:
        with self._lock:
            self._live.append(live)
            self._wake.notify()

    def _outcome(self, live: _Live, now: float) -> bool:
        """Learn a live handle's outcome (done, failed or past its deadline); False if pending."""
        try:
            state = self._agent.check_xfer_state(live.handle)
        except Exception as exc:
            live.error = self._error(live.agent, exc)
        else:
            if state == "PROC":
                if now <= live.deadline:
                    return False
                stalled = f"transfer to {live.agent} stalled for {live.timeout:g}s"
                live.error = TransferError(stalled)
            elif state != "DONE":
                live.error = self._state_error(live.agent, state)
        live.known = True
        return True

    def _progress_main(self) -> None:
        """Run `_progress_step` until the transport closes. A step that raises is logged (once
        per run of failures) and the next starts after RELEASE_RETRY_S: every deadline and
        release in this transport depends on this thread, so an error never ends it."""
        failing = False
        while True:
            try:
                if self._progress_step():
                    return
                failing = False
            except Exception:
                if not failing:
                    log.exception("NIXL progress step failed (retrying)")
                failing = True
                time.sleep(RELEASE_RETRY_S)

    def _progress_step(self) -> bool:
        """One round: poll every live handle (back to back with the next round: no back-off)
        until it is done, failed or past its deadline; drain notifications on their own pace,
        busy or idle. True once the transport is closed."""
        with self._lock:
            if not self._live and not self._closed:
                self._wake.wait(max(0.0, self._next_drain - time.monotonic()))
            if self._closed:
                return True
            live = list(self._live)
        now = time.monotonic()
        if live:
            self._active_until = now + ACTIVE_WINDOW_S
        if now >= self._next_drain:
            self._drain(now)
        if not live:
            return False
        finished: list[_Live] = []
        try:
            for item in live:
                if (
                    (item.known or self._outcome(item, now))
                    and now >= item.next_release
                    and self._release(item)
                ):
                    finished.append(item)
        finally:  # even if the round broke off: a released handle is never reported twice
            if finished:
                gone = {id(x) for x in finished}
                with self._lock:
                    self._live = [x for x in self._live if id(x) not in gone]
        if not finished:
            time.sleep(PROGRESS_PAUSE_S)  # yield the GIL; a fixed pause, never a back-off
        return False

    def _drain(self, now: float) -> None:
        """Move NIXL's new notifications into the buffer (this progresses the UCX worker)."""
        quiet = now >= self._active_until
        self._next_drain = now + (DRAIN_QUIET_S if quiet else DRAIN_ACTIVE_S)
        with self._lock:
            if self._notif_count >= MAX_BUFFERED_NOTIFS:
                return
        try:
            new = self._agent.get_new_notifs()
        except Exception as exc:  # logged once per run of failures; the thread goes on
            if not self._drain_failed:
                log.warning("draining NIXL notifications failed: %s", exc)
            self._drain_failed = True
            return
        self._drain_failed = False
        if not new:
            return
        self._active_until = now + ACTIVE_WINDOW_S
        with self._lock:
            for agent, messages in new.items():
                self._notifs.setdefault(agent, []).extend(messages)
                self._notif_count += len(messages)

    def live_count(self) -> int:
        with self._lock:
            return len(self._live)

    def notify(self, agent: str, message: bytes) -> None:
        try:
            self._agent.send_notif(agent, message)
        except Exception as exc:
            raise TransferError(f"notification to {agent} failed: {exc}") from exc

    def poll_notifs(self) -> dict[str, list[bytes]]:
        """The notifications the progress thread drained since the last call (no UCX call)."""
        with self._lock:
            notifs, self._notifs, self._notif_count = self._notifs, {}, 0
        return notifs

    def close(self) -> None:
        deadline = time.monotonic() + WRITE_WAIT_GRACE_S
        while self.live_count() and time.monotonic() < deadline:
            time.sleep(0.001)  # shutdown only: let in-flight WRITEs finish or hit their deadline
        with self._lock:
            self._closed = True
            self._wake.notify_all()
        self._progress.join(timeout=1.0)
        for agent in list(self._remote):
            self.remove_peer(agent)
        _quietly("releasing local descriptors", self._agent.release_dlist_handle, self._local)
        _quietly("deregistering the KV pool", self._agent.deregister_memory, self._reg)


def _quietly(what: str, call: Callable[[Any], object], arg: Any) -> None:
    try:
        call(arg)
    except Exception as exc:
        log.warning("%s: %s", what, exc)
