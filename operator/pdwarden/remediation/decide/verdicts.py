"""Which decode pods the canary asks, and what its verdicts mean for the plan.

Why pure and apart from the ladder: on an engine whose decodes a canary confirms (vLLM) a decode
whose engine froze behind its live API server leaves no trace on its own metrics; the prefill's
LeaseExpired finding only names suspects (detect/pull.py). The canary (`confirm.canary`)
turns a suspicion into evidence, and what counts as a candidate and as evidence decides whether a
pod is cordoned, so both are plain functions here, unit-tested without a network:

* candidates: the decodes a LeaseExpired finding names as suspects this cycle, plus the decodes
  cordoned by us (in DryRun: by a recorded decision), so the ladder can tell "still dead"
  (RestartDecode after restartAfterSeconds) from "alive again" (UncordonDecode). Never a pod
  that is stale, terminating or not running (those are stale to the cycle too), at most once;
  the confirm stage leaves out those a pair canary already judged this cycle.
  DryRun asks too: a canary changes nothing, and the decision it leads to is only recorded.
* with_verdicts: a dead verdict makes the decode stalled and never healthy (ladder.py, rung 2v,
  then treats it as serving nobody); alive and unknown change nothing. Every verdict on a
  suspect is written into the LeaseExpired finding's evidence, so the status and the
  WedgeDetected Event say what the canary found.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from pdwarden import engines
from pdwarden.api import LedgerEntry
from pdwarden.remediation.decide.actions import PodState
from pdwarden.remediation.decide.history import cordoned_at
from pdwarden.remediation.detect.evidence import Finding
from pdwarden.remediation.detect.rules import Detection
from pdwarden.values import CanaryResult

SUSPICION = "LeaseExpired"  # the finding whose suspects a canary confirms


def candidates(
    engine: str,
    detection: Detection,
    decodes: Sequence[PodState],
    history: Sequence[LedgerEntry],
    *,
    dry_run: bool,
) -> tuple[str, ...]:
    """The decode pods to ask this cycle, each once, sorted; none unless the engine's decodes
    are confirmed by a canary."""
    if not engines.get(engine).canary_confirms_decodes:
        return ()
    suspects = {s for f in detection.findings if f.reason == SUSPICION for s in f.suspects}
    return tuple(
        sorted(
            d.name
            for d in decodes
            if not d.stale
            and not d.terminating
            and (d.name in suspects or cordoned_at(d, history, dry_run) is not None)
        )
    )


def _noted(f: Finding, verdicts: dict[str, CanaryResult]) -> Finding:
    asked = [verdicts[s] for s in f.suspects if s in verdicts]
    if f.reason != SUSPICION or not asked:
        return f
    said = "; ".join(f"{c.pod} {c.verdict} ({c.detail})" for c in asked)
    return replace(f, evidence=f"{f.evidence}; canary: {said}")


def with_verdicts(detection: Detection, results: Sequence[CanaryResult]) -> Detection:
    """`detection` as the plan reads it once the canaries answered."""
    if not results:
        return detection
    verdicts = {c.pod: c for c in results}
    dead = frozenset(n for n, c in verdicts.items() if c.verdict == "dead")
    return replace(
        detection,
        findings=tuple(_noted(f, verdicts) for f in detection.findings),
        stalled_decodes=detection.stalled_decodes | dead,
        healthy_decodes=detection.healthy_decodes - dead,
        canaries={**detection.canaries, **verdicts},
    )
