"""e2e.capacity, the closed client loops the engine tiers measure a pair's capacity with (the
measurements themselves are opt-in scenarios of the real-engine tiers)."""

from __future__ import annotations

import threading

import pytest
from e2e.capacity import Point, closed_loops, share_reached


def test_each_loop_keeps_one_request_in_flight_and_every_answer_is_counted() -> None:
    in_flight, peak, sent = 0, 0, []
    lock = threading.Lock()
    entered = threading.Barrier(3)

    def send(n: int) -> None:
        nonlocal in_flight, peak
        with lock:
            in_flight += 1
            peak = max(peak, in_flight)
            sent.append(n)
        if len(sent) <= 3:
            entered.wait(5)  # all three loops are in their first request at once
        with lock:
            in_flight -= 1

    point = closed_loops(send, 3, 0.2)
    assert peak == 3
    assert point.loops == 3 and point.answered == len(sent) and point.seconds >= 0.2
    assert len(set(sent)) == len(sent)  # every loop numbers its own requests


def test_a_failed_request_is_raised_not_counted_as_capacity() -> None:
    def send(n: int) -> None:
        if n == 4:
            raise AssertionError("503: no worker")

    with pytest.raises(AssertionError, match="503"):
        closed_loops(send, 2, 5.0)


def test_the_share_is_the_rate_at_those_loops_over_the_peak() -> None:
    points = [Point(1, 10, 10.0), Point(2, 19, 10.0), Point(4, 20, 10.0), Point(8, 18, 10.0)]
    assert share_reached(points, 2) == pytest.approx(0.95)
    assert share_reached(points, 4) == 1.0
    assert share_reached(points, 3) == 0.0  # not measured: no claim
    assert share_reached([], 2) == 0.0
    assert share_reached([Point(2, 0, 10.0)], 2) == 0.0
