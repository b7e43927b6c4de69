"""How much a real pair serves, measured with closed client loops at rising concurrency.

Why a module: the abort storms of both engine tiers claim to run a pair at (nearly) its
capacity, so the capacity is measured, not assumed. A closed loop sends its next request the
moment its last one is answered, so `loops` requests are in the pair at all times; the answers
per second level off where the pair saturates. `share_reached` says how close to that level a
given number of loops comes: a storm that keeps as many requests in the pair as the loops that
reach 90 % of the peak offers at least 90 % of the pair's capacity (its hang-ups only shorten
some requests, the pair still never waits for work).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Point:
    loops: int
    answered: int
    seconds: float

    @property
    def per_second(self) -> float:
        return self.answered / self.seconds if self.seconds > 0 else 0.0


def closed_loops(send: Callable[[int], object], loops: int, seconds: float) -> Point:
    """`loops` threads call `send(n)` back to back for `seconds`; the answers counted over the
    time until the last one returned. `send` raises on a failed request: the first failure is
    raised here (a capacity with failures in it is not one)."""
    stop_at = time.monotonic() + seconds
    answered = [0] * loops
    failures: list[BaseException] = []

    def loop(i: int) -> None:
        n = i
        while time.monotonic() < stop_at and not failures:
            try:
                send(n)
            except Exception as exc:  # handed to the caller below
                failures.append(exc)
                return
            answered[i] += 1
            n += loops

    start = time.monotonic()
    threads = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(loops)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 300)
    if failures:
        raise failures[0]
    return Point(loops, sum(answered), time.monotonic() - start)


def curve(send: Callable[[int], object], loops: Sequence[int], seconds: float) -> list[Point]:
    """`closed_loops` at each concurrency in turn."""
    return [closed_loops(send, n, seconds) for n in loops]


def share_reached(points: Sequence[Point], loops: int) -> float:
    """The answers per second measured at `loops` over the highest of the curve (0 if `loops`
    was not measured or nothing was answered)."""
    peak = max((p.per_second for p in points), default=0.0)
    at = [p.per_second for p in points if p.loops == loops]
    return at[0] / peak if at and peak > 0 else 0.0


def describe(points: Sequence[Point]) -> str:
    return ", ".join(f"{p.loops} loops {p.per_second:.1f}/s" for p in points)
