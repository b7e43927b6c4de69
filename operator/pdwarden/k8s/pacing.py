"""How many API calls the operator has in flight at once, adapted to the API server's answers.

Why: a reconcile pass applies a dozen objects at once. On a priority level with fewer seats that
rejects instead of queueing (API Priority and Fairness), such a burst is partly refused every
time, and sent again as a burst it is refused again: measured on a level of 3 seats, passes
failed for minutes after the load that had filled the level was gone. Halving the calls in
flight at each refusal, and growing them back by one a second while answers come (additive
increase, multiplicative decrease, as TCP does on a congested link), lets the burst through a
seat's worth at a time, and changes nothing while nothing is refused. Grown by one per round of
answers instead (TCP's own pace), the limit was back above the level's 3 seats within a pass,
and every pass had a refusal in it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

GROWTH_STEP = 1.0  # seconds between two increases of the limit


@dataclass
class Pacer:
    most: int  # calls in flight when nothing is refused (the client's threads)
    clock: Callable[[], float] = time.monotonic
    limit: int = field(init=False)
    running: int = 0
    _changed_at: float = field(default=0.0, repr=False)
    _waiting: list[asyncio.Future[None]] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        self.limit = self.most

    async def acquire(self, deadline: float) -> bool:
        """Wait for a slot until the monotonic `deadline`; whether one was taken."""
        while self.running >= self.limit:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            turn = asyncio.get_running_loop().create_future()
            self._waiting.append(turn)
            try:
                await asyncio.wait_for(turn, left)
            except TimeoutError:
                return False
            finally:
                if turn in self._waiting:
                    self._waiting.remove(turn)
        self.running += 1
        return True

    def release(self) -> None:
        self.running -= 1
        self._wake()

    def refused(self) -> None:
        """The API server turned a call away for load: half as many in flight."""
        self.limit = max(1, self.limit // 2)
        self._changed_at = self.clock()

    def answered(self) -> None:
        """A call was taken: one more in flight, if the last change is a step old."""
        now = self.clock()
        if self.limit < self.most and now - self._changed_at >= GROWTH_STEP:
            self.limit += 1
            self._changed_at = now
            self._wake()

    def _wake(self) -> None:
        free = self.limit - self.running
        for turn in self._waiting[: max(free, 0)]:
            if not turn.done():
                turn.set_result(None)
