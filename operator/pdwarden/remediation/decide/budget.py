"""The safety envelope's arithmetic: how many decodes may be out, and the circuit breaker.

Why apart from the ladder: the status reports the same budget and breaker the plan obeys
(record/ledger.py, PDRemediationPolicy scope), so there is one place each is computed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from pdwarden.api import LedgerEntry, RemediationSpec

HOUR = timedelta(hours=1)


def decode_budget(spec: RemediationSpec, decode_replicas: int) -> int:
    value = spec.max_unavailable_decode
    if isinstance(value, str):
        return math.floor(decode_replicas * int(value.rstrip("%")) / 100)
    return int(value)


def actions_in_last_hour(
    history: Sequence[LedgerEntry], now: datetime, dry_run: bool, reset_at: datetime | None
) -> int:
    since = now - HOUR
    if reset_at is not None and reset_at > since:
        since = reset_at
    return sum(
        1
        for e in history
        if e.time > since
        and e.dry_run == dry_run
        and e.outcome != "Skipped"
        and e.action != "UncordonDecode"
    )


@dataclass(frozen=True)
class Breaker:
    """The circuit breaker over a ledger: actions counted this hour, and whether it is open."""

    used: int
    limit: int

    @property
    def open(self) -> bool:
        return self.used >= self.limit


def breaker(
    history: Sequence[LedgerEntry],
    now: datetime,
    *,
    dry_run: bool,
    reset_at: datetime | None,
    limit: int,
) -> Breaker:
    """The one place the breaker's state is computed (for the plan and for the status)."""
    return Breaker(actions_in_last_hour(history, now, dry_run, reset_at), limit)
