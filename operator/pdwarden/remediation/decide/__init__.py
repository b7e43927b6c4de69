"""Stage 3, decide: findings + spec + ledger + pod states -> the actions to take now (pure)."""

from pdwarden.remediation.decide.actions import ActionKind, Plan, PlannedAction, PodState
from pdwarden.remediation.decide.budget import Breaker, actions_in_last_hour, breaker, decode_budget
from pdwarden.remediation.decide.history import cordoned_at
from pdwarden.remediation.decide.ladder import plan

__all__ = [
    "ActionKind", "Breaker", "Plan", "PlannedAction", "PodState", "actions_in_last_hour",
    "breaker", "cordoned_at", "decode_budget", "plan",
]  # fmt: skip
