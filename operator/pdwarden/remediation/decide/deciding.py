"""One round of deciding: the inputs every rung reads and the decisions they add up.

Why a class and not closures: each rung (`rungs`) is a plain function of this state and one
finding or pod, so each can be read, named and unit-tested on its own; the questions several
rungs ask (is the breaker open, is the pod cooling down, how much budget is left) are answered
here, once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from pdwarden.api import LedgerEntry, RemediationSpec
from pdwarden.remediation.decide.actions import PlannedAction, PodState
from pdwarden.remediation.decide.history import cordoned_at, last_action_on
from pdwarden.remediation.detect.rules import Detection


@dataclass
class Deciding:
    spec: RemediationSpec
    detection: Detection
    decodes: Sequence[PodState]
    prefills: Sequence[PodState]
    history: Sequence[LedgerEntry]
    now: datetime
    budget: int
    used: int  # actions the breaker counted this hour before this round
    # A pod with a Pending entry (a replica died while acting on it) gets nothing new until the
    # entry is settled from what the pod shows: acting first would make the settling read our
    # own action as the dead replica's, and count one action twice or lose one.
    unsettled: Mapping[str, LedgerEntry] = field(default_factory=dict)
    actions: list[PlannedAction] = field(default_factory=list)
    held: list[str] = field(default_factory=list)
    repeat_offenders: set[str] = field(default_factory=set)  # decodes FailRooms points at again
    prefill_acted: set[str] = field(default_factory=set)  # prefill pods decided on this round

    @property
    def dry_run(self) -> bool:
        return self.spec.mode == "DryRun"

    @property
    def dead(self) -> frozenset[str]:
        """Decodes a canary confirmed dead this cycle: serving nobody, whatever readiness says."""
        return self.detection.dead_decodes

    def breaker_open(self) -> bool:
        # Actions planned this round count too, so one round cannot overshoot the limit.
        planned = sum(1 for a in self.actions if a.kind != "UncordonDecode")
        return self.used + planned >= self.spec.max_actions_per_hour

    def refusal(self, kind: str, subject: str) -> str | None:
        """Why `kind` may not run at all now (not allowed, breaker open), else None. `subject`
        names its pod as the held-back line shows it ("on pod-0" for prefill rungs)."""
        if kind not in self.spec.actions:
            return f"{kind} {subject}: not in spec.remediation.actions"
        if self.breaker_open():
            return f"{kind} {subject}: remediation suspended by the circuit breaker"
        return None

    def cooling(self, pod: str) -> bool:
        last = last_action_on(self.history, pod, self.dry_run)
        cooldown = timedelta(seconds=self.spec.cooldown_seconds)
        return last is not None and self.now - last.time < cooldown

    def settling(self, kind: str, pod: str) -> bool:
        e = self.unsettled.get(pod)
        if e is not None:
            self.held.append(f"{kind} {pod}: waiting for the outcome of {e.action}, still Pending")
        return e is not None

    def cordoned_since(self, d: PodState) -> datetime | None:
        return cordoned_at(d, self.history, self.dry_run)

    def budget_left(self) -> int:
        out = {
            d.name for d in self.decodes if self.cordoned_since(d) or not d.ready or d.terminating
        }
        out |= {a.pod for a in self.actions if a.kind == "CordonDecode"}
        return self.budget - len(out - self.dead)

    def serving_left(self) -> int:
        cordoning = {a.pod for a in self.actions if a.kind == "CordonDecode"}
        return sum(
            1
            for d in self.decodes
            if d.ready
            and not self.cordoned_since(d)
            and not d.terminating
            and d.name not in cordoning
            and d.name not in self.dead
        )

    def canary_says(self, name: str) -> str:
        canaries = self.detection.canaries
        return f"canary: {canaries[name].detail}" if name in canaries else ""

    def prefill_uid(self, name: str) -> str:
        return next((p.uid for p in self.prefills if p.name == name), "")

    def prefills_busy(self, besides: str) -> list[str]:
        """Other prefill pods not ready or going away: a prefill restart waits for them."""
        return [
            p.name for p in self.prefills if p.name != besides and (p.terminating or not p.ready)
        ]
