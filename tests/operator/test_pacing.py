"""The API client's pacer: calls in flight halved at each throttled answer, grown back by one a
second while answers come, never below one nor above the client's threads."""

from __future__ import annotations

import asyncio
import time

from pdwarden.k8s.pacing import Pacer


def test_nothing_refused_every_thread_runs_at_once() -> None:
    async def main() -> int:
        pacer = Pacer(4)
        taken = [await pacer.acquire(time.monotonic() + 1) for _ in range(4)]
        assert all(taken)
        return pacer.running

    assert asyncio.run(main()) == 4


def test_refusals_halve_the_calls_in_flight_down_to_one() -> None:
    pacer = Pacer(8)
    for want in (4, 2, 1, 1):
        pacer.refused()
        assert pacer.limit == want


def test_answers_grow_it_back_by_one_a_second_up_to_the_threads() -> None:
    now = [100.0]
    pacer = Pacer(4, clock=lambda: now[0])
    pacer.refused()
    pacer.refused()  # one at a time
    for _ in range(10):
        pacer.answered()  # many answers within the second: no growth yet
    assert pacer.limit == 1
    now[0] += 1.0
    pacer.answered()
    pacer.answered()
    assert pacer.limit == 2
    for _ in range(5):
        now[0] += 1.0
        pacer.answered()
    assert pacer.limit == 4


def test_a_call_waits_for_a_free_slot_and_gives_up_at_its_deadline() -> None:
    async def main() -> tuple[bool, bool, int]:
        pacer = Pacer(2)
        pacer.refused()  # one at a time
        assert await pacer.acquire(time.monotonic() + 1)
        gave_up = not await pacer.acquire(time.monotonic() + 0.05)
        queued = asyncio.Event()
        pacer._waiting = _Queue(queued)  # the pacer signals nothing when a call queues: this does
        waiter = asyncio.create_task(pacer.acquire(time.monotonic() + 5))
        async with asyncio.timeout(1):
            await queued.wait()
        assert len(pacer._waiting) == 1 and not waiter.done()
        pacer.release()  # the first call answered: the waiter goes
        return gave_up, await waiter, pacer.running

    assert asyncio.run(main()) == (True, True, 1)


class _Queue(list[asyncio.Future[None]]):
    """The pacer's wait list, setting `queued` when a call joins it."""

    def __init__(self, queued: asyncio.Event) -> None:
        super().__init__()
        self.queued = queued

    def append(self, turn: asyncio.Future[None]) -> None:
        super().append(turn)
        self.queued.set()
