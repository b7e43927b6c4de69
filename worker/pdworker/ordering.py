"""Order NIXL transfers after the device work that produced (or reads) the KV pages.

Why: torch launches CUDA kernels asynchronously, while NIXL reads and writes VRAM directly. A
WRITE posted right after `pool.write_tokens` returns may read pages the scatter kernel has not
written yet (measured on an H200: hundreds of KV checksum mismatches per storm, gone with
CUDA_LAUNCH_BLOCKING=1). So every producer of pages records a `Fence` on its stream after the
work, and whoever hands those pages to NIXL (or frees them for reuse) waits for it first.

On CPU torch ops are synchronous: a fence is already passed when it is made, and waiting costs
nothing, but the same calls run on the same code paths, so CPU tests exercise the ordering.
The event factory is injectable so tests can observe record/wait order with a fake.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch


class Event(Protocol):
    def record(self) -> None: ...

    def synchronize(self) -> None: ...

    def query(self) -> bool: ...


class Fence:
    """A point on a device stream; `wait()` returns once all work launched before it finished."""

    __slots__ = ("_event",)

    def __init__(self, event: Event | None) -> None:
        self._event = event

    def wait(self) -> None:
        if self._event is not None:
            self._event.synchronize()

    def passed(self) -> bool:
        return self._event is None or bool(self._event.query())


PASSED = Fence(None)


class Ordering:
    """Makes fences for one device; `fence()` after launching work, `Fence.wait()` before NIXL."""

    def __init__(
        self, device: torch.device, event_factory: Callable[[], Event] | None = None
    ) -> None:
        self.device = device
        if event_factory is not None:
            self._factory: Callable[[], Event] | None = event_factory
        elif device.type == "cuda":
            self._factory = _cuda_event
        else:
            self._factory = None

    @property
    def asynchronous(self) -> bool:
        return self._factory is not None

    def fence(self) -> Fence:
        """Record a fence on the current stream of this thread (after the work to be ordered)."""
        if self._factory is None:
            return PASSED
        event = self._factory()
        event.record()
        return Fence(event)

    def sync(self) -> None:
        """Wait for everything launched so far on this thread's stream (fence + wait)."""
        self.fence().wait()


def _cuda_event() -> Any:
    # blocking=True (cudaEventBlockingSync): a thread in `Fence.wait()` sleeps until the device
    # reaches the event. With blocking=False `synchronize()` spin-waits, and every transfer
    # thread waiting for its chunk's fence would burn a CPU core the event loop needs.
    return torch.cuda.Event(blocking=True)  # type: ignore[no-untyped-call]
