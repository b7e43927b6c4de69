"""What the plan works on and what it returns: pod states in, planned actions out.

Why a module of its own: the rungs, the ladder, the canary verdicts, the PDRemediationPolicy
scope and the acting half all speak these three types; defining them below all of them keeps
every import pointing down. `ActionKind` is the ledger's action enum (api); a `PlannedAction`
is one decision to carry out, named apart so the two are never confused.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from pdwarden.api.status import LedgerAction

ActionKind = LedgerAction  # the plan's actions are exactly what the ledger records


@dataclass(frozen=True)
class PodState:
    """A worker pod's serving state as the API server shows it (either role)."""

    name: str
    uid: str
    ready: bool
    cordoned_since: datetime | None = None  # serving condition False since (set by us)
    terminating: bool = False
    stale: bool = False


@dataclass(frozen=True)
class PlannedAction:
    kind: ActionKind
    pod: str
    reason: str
    uid: str = ""
    rooms: tuple[int, ...] = ()
    room_count: int = 0
    peer: str | None = None


@dataclass(frozen=True)
class Plan:
    actions: tuple[PlannedAction, ...] = ()
    suspended: bool = False
    budget: int = 0
    held_back: tuple[str, ...] = ()  # decisions not taken, and why
    dry_run: bool = False
