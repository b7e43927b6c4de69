"""Narration stamped with the seconds since the start, and polling: what both demo stories share."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class Clock:
    """Narration with the time since the demo started."""

    def __init__(self) -> None:
        self.t0 = time.time()
        self._lock = threading.Lock()

    def say(self, msg: str) -> None:
        with self._lock:
            print(f"[{time.time() - self.t0:6.1f}s] {msg}", flush=True)


def wait_for(check: Callable[[], T], timeout: float, every: float = 0.5) -> T | None:
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got or time.monotonic() > deadline:
            return got or None
        time.sleep(every)
