"""What performing one action did, in the words every action module answers with.

Why a value of its own: the cycle turns it into the ledger entry (record.ledger) whatever the
target was (a worker's admin API, SGLang's, a pod condition, a label, a delete, an eviction), so
each action module only says what happened, never how the ledger spells it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pdwarden.api import HeldBack

Outcome = Literal["Succeeded", "Failed", "Skipped"]


@dataclass(frozen=True)
class Done:
    """`detail` goes to the ledger reason; `rooms` replaces the planned count (FailRooms: rooms
    the worker really failed; AbortRequests: requests the prefill held); `held` is a refusal
    (a PodDisruptionBudget) to show in a policy's status."""

    outcome: Outcome = "Succeeded"
    detail: str = ""
    rooms: int | None = None
    held: HeldBack | None = None


def skipped(why: str, rooms: int | None = None) -> Done:
    return Done("Skipped", f"skipped: {why}", rooms)
