"""Which prefill/decode pairs a pair canary goes through, and what its outcome means for the plan.

Why pure and apart from the sending (`confirm.pair_canary`): whom pdwarden suspects and what it
concludes decides whether a pod is restarted or cordoned, so both are plain functions of the
pods' histories, unit-tested without a network.

* A pod is STILL when none of its own progress counters moved between its last two fresh
  scrapes (canaries excluded: `memory.organic`): a frozen engine is still from the scrape
  interval after its freeze, with work or without; so is an idle one, and one between two
  bursts. Still is only a suspicion: it never acts.
* Each still pod, at most once per canary.quietSeconds, gets a pair canary with a partner of the
  other role, one that is not still if there is one (proven alive: if the canary then fails on
  the still side, that side is the one). So a pod that stops is asked a scrape interval later,
  and an idle one once per quiet window, which bounds what canaries cost: one per pod per
  window at most. An idle pool's two still pods are asked together: the leg that gets no
  answer names the dead side. At most MAX_PAIRS pairs a cycle.
* A side is dead only after canary.failureThreshold canaries in a row got no answer from it
  while its counters stood still (`judged`): one such canary on a busy machine is a stall as
  often as a death (the vLLM tier on two shared cores once restarted a healthy prefill on one),
  so before the threshold it is a suspect, asked again at once (`ask_again`): the misses in a
  row are canaries back to back, so a frozen engine is dead failureThreshold deadlines after it
  was suspected, not quiet windows later. An answer from the side starts its count again;
  unknown leaves it.
* Outcomes: decode_dead makes the decode dead for the ladder exactly as the one-token canary's
  dead verdict does (rung 2v: cordon, then restart while it stays dead); prefill_dead is a
  PrefillDead finding on the prefill (rung 1p: restart it), and a decode that answered that
  canary is no longer stalled (it waits on the dead prefill), and while a decode is dead no
  prefill's gauge-read stuck queue (InflightGaugeStuck) is its own; decoded (and alive, the "health"
  protocol's answer) proves both alive; suspect and unknown prove nothing and never act.
* TransfersFailing (a prefill whose transfers fail while every decode is in sight,
  `detect.rules`) is a suspicion: its prefill is due for a canary as a still pod is. It is
  confirmed once canary.failureThreshold KV requests in a row through that prefill did not
  complete while both sides answered their health checks (`kv_counts`: outcome alive with the
  KV request sent; asked again at once below the threshold, `ask_kv_again`), and only then
  repaired (`rungs.restart_failing_prefill`). A canary through it that decoded within the
  wedge window proves its KV path works: the finding is dropped while that lasts (client
  aborts count as transfer failures too), and the prefill is asked again each quiet window.
* A decode found dead stays dead between its canaries (`held_dead`) while its counters stand
  still and it answered nothing since: its repair spans cycles (cordon, then restart
  restartAfterSeconds later), and a cycle in the quiet window after its last canary learns
  nothing new of it. So that cycle needs no one-token canary on it either (30 s a cycle, the
  object's lock held); the next canary through it, within a quiet window, asks again, and one
  answer ends it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace
from typing import Final

from pdwarden.constants import ROLE_DECODE, ROLE_PREFILL
from pdwarden.remediation.detect.evidence import Finding, PodView, moved
from pdwarden.remediation.detect.rules import Detection
from pdwarden.values import CanaryResult, PairResult

SUSPICION: Final = "TransfersFailing"  # the finding a pair canary confirms before it acts
MAX_PAIRS: Final = 2  # pair canaries per object per cycle: each holds a connection for its legs
PROGRESS: Final = ("prefill_tokens", "generated_tokens", "kv_transfers", "completed")


def still(view: PodView) -> bool:
    """No progress counter of the pod moved between its last two fresh scrapes."""
    if view.stale or len(view.history) < 2:
        return False
    return not any(moved(view.history[-2:], c) for c in PROGRESS)


def pairs_to_ask(
    views: Sequence[PodView],
    last_asked: Mapping[str, float],
    now: float,
    seconds: float,
    confirm: Collection[str] = (),
) -> list[tuple[str, str]]:
    """(prefill, decode) pairs to send a canary through this cycle for its still pods and the
    pods in `confirm` (suspicions to confirm), each pod at most once and none asked within
    `seconds` before `now` (monotonic), sorted for a stable order."""
    fresh = [v for v in views if not v.stale and v.latest is not None]
    silent = {v.name for v in fresh if still(v)}
    asking = silent | ({v.name for v in fresh} & set(confirm))
    due = sorted(n for n in asking if now - last_asked.get(n, -1e18) >= seconds)
    out: list[tuple[str, str]] = []
    used: set[str] = set()
    for name in due:
        if name in used or len(out) >= MAX_PAIRS:
            continue
        me = next(v for v in fresh if v.name == name)
        other = ROLE_DECODE if me.role == ROLE_PREFILL else ROLE_PREFILL
        partners = sorted(
            (v for v in fresh if v.role == other and v.name not in used),
            key=lambda v: (v.name in silent, v.name),
        )
        if not partners:
            continue
        partner = partners[0].name
        pair = (name, partner) if me.role == ROLE_PREFILL else (partner, name)
        out.append(pair)
        used |= set(pair)
    return out


def judged(
    results: Sequence[PairResult], misses: Mapping[str, int], threshold: int
) -> tuple[list[PairResult], dict[str, int]]:
    """The results with each dead side counted: (results, pod -> canaries in a row it gave no
    answer to, for the pods asked). A dead outcome stays dead only once its pod reached
    `threshold` misses in a row; below that it is `suspect`. A side that answered starts again
    at 0; an unknown outcome leaves the count as it was."""
    out: list[PairResult] = []
    counts: dict[str, int] = {}
    for r in results:
        counts.setdefault(r.prefill, misses.get(r.prefill, 0))
        counts.setdefault(r.decode, misses.get(r.decode, 0))
        for pod, answered in ((r.prefill, r.prefill_answered), (r.decode, r.decode_answered)):
            if answered:
                counts[pod] = 0
        dead = {"prefill_dead": r.prefill, "decode_dead": r.decode}.get(r.outcome)
        if dead is None:
            out.append(r)
            continue
        counts[dead] += 1
        n = counts[dead]
        if n >= threshold:
            out.append(replace(r, detail=f"{r.detail} ({n} canaries in a row)" if n > 1
                               else r.detail))  # fmt: skip
        else:
            why = f"{r.detail} (suspect: {n} of {threshold} canaries in a row; asked again)"
            out.append(replace(r, outcome="suspect", detail=why))
    return out, counts


def ask_again(results: Sequence[PairResult], misses: Mapping[str, int], threshold: int) -> bool:
    """Whether the pair that gave `results` (back to back, oldest first) is asked again at once:
    its last canary left a side unanswered, fewer than `threshold` times in a row."""
    if not results:
        return False
    judged_results, _ = judged(results, misses, threshold)
    return judged_results[-1].outcome == "suspect"


def kv_failed(result: PairResult) -> bool:
    """The canary's KV request went out and did not complete while both sides answered their
    health checks: the pair is alive and its KV path is not."""
    return result.kv_sent and result.outcome == "alive"


def kv_counts(results: Sequence[PairResult], counts: Mapping[str, int]) -> dict[str, int]:
    """Prefill -> KV requests in a row through it that did not complete (`kv_failed`), updated
    by `results` (oldest first) for the prefills they went through: a decoded one starts the
    count again; any other outcome leaves it."""
    out: dict[str, int] = {}
    for r in results:
        n = out.get(r.prefill, counts.get(r.prefill, 0))
        out[r.prefill] = 0 if r.outcome == "decoded" else n + 1 if kv_failed(r) else n
    return out


def ask_kv_again(
    results: Sequence[PairResult],
    counts: Mapping[str, int],
    threshold: int,
    confirm: Collection[str],
) -> bool:
    """Whether the pair that gave `results` (back to back, oldest first) is asked again at once
    to confirm a suspicion on its prefill: its last KV request did not complete, fewer than
    `threshold` times in a row."""
    if not results or results[-1].prefill not in confirm or not kv_failed(results[-1]):
        return False
    return kv_counts(results, counts)[results[-1].prefill] < threshold


def held_dead(
    views: Sequence[PodView], misses: Mapping[str, int], threshold: int, asked: Collection[str]
) -> dict[str, int]:
    """Decode -> canaries in a row it gave no answer to, for each decode not asked this cycle
    that is still dead by its last canaries: `threshold` misses or more, none answered since,
    its counters still standing still."""
    return {
        v.name: n
        for v in views
        if v.role == ROLE_DECODE
        and v.name not in asked
        and (n := misses.get(v.name, 0)) >= threshold
        and still(v)
    }


def _confirmed(
    findings: Sequence[Finding],
    results: Sequence[PairResult],
    kv_failures: Mapping[str, int],
    threshold: int,
    kv_moved: Collection[str],
) -> list[Finding]:
    """The findings with each TransfersFailing judged: dropped when a canary through its prefill
    decoded this cycle or recently (`kv_moved`), confirmed at `threshold` KV requests in a row
    that did not complete (`kv_counts`), else left a suspicion."""
    decoded = {r.prefill for r in results if r.outcome == "decoded"} | set(kv_moved)
    out = []
    for f in findings:
        if f.reason != SUSPICION or f.confirmed:
            out.append(f)
        elif f.pod in decoded:
            continue  # its KV moved just now: the failures were not the path's
        elif (n := kv_failures.get(f.pod, 0)) >= threshold:
            last = next((r for r in reversed(results) if r.prefill == f.pod and kv_failed(r)),
                        None)  # fmt: skip
            how = f" (last with {last.decode}: {last.detail})" if last is not None else ""
            why = (f"{f.evidence}; confirmed: {n} pair canaries in a row moved no KV while both "
                   f"sides answered their health checks{how}")  # fmt: skip
            out.append(replace(f, confirmed=True, evidence=why))
        else:
            out.append(f)
    return out


def with_pair_outcomes(
    detection: Detection,
    results: Sequence[PairResult],
    held: Mapping[str, int] | None = None,
    *,
    kv_failures: Mapping[str, int] | None = None,
    threshold: int = 1,
    kv_moved: Collection[str] = (),
) -> Detection:
    """`detection` as the plan reads it once the pair canaries answered, with the decodes
    `held_dead` (decode -> misses in a row) still dead and each TransfersFailing judged by the
    prefills' KV requests in a row that did not complete (`kv_failures`, `kv_counts`) and by
    those a canary's KV moved through within the wedge window (`kv_moved`)."""
    findings = _confirmed(detection.findings, results, kv_failures or {}, threshold, kv_moved)
    if not results and not held:
        return replace(detection, findings=tuple(findings))
    canaries = dict(detection.canaries)
    for name, n in sorted((held or {}).items()):
        why = f"pair canary: no answer to the last {n} canaries, still since"
        canaries[name] = CanaryResult(name, "dead", why)
        findings.append(Finding(pod=name, role=ROLE_DECODE, reason="DecodeDead", evidence=why))
    for r in results:
        if r.outcome == "prefill_dead":
            findings.append(
                Finding(pod=r.prefill, role=ROLE_PREFILL, reason="PrefillDead",
                        evidence=f"pair canary with {r.decode}: {r.detail}")
            )  # fmt: skip
        elif r.outcome == "decode_dead":
            canaries[r.decode] = CanaryResult(r.decode, "dead", f"pair canary: {r.detail}")
            findings.append(
                Finding(pod=r.decode, role=ROLE_DECODE, reason="DecodeDead",
                        evidence=f"pair canary with {r.prefill}: {r.detail}")
            )  # fmt: skip
        elif r.outcome in ("decoded", "alive") and canaries.get(r.decode) is None:
            canaries[r.decode] = CanaryResult(r.decode, "alive", f"pair canary: {r.detail}")
    # A decode that answered while its prefill was found dead waits on that prefill: its stall
    # is the prefill's (SGLang's gauges even keep showing its requests running), not its own.
    waiting = {r.decode for r in results if r.outcome == "prefill_dead" and r.decode_answered}
    findings = [f for f in findings if not (f.reason == "DecodeStalled" and f.pod in waiting)]
    dead = frozenset(n for n, c in canaries.items() if c.verdict == "dead")
    if dead:
        # Likewise a prefill's queue that stopped draining while a decode is dead: its rooms
        # wait on that decode (SGLang's prefill gauges stay at their last snapshot meanwhile),
        # and the decode's repair is what frees them.
        findings = [f for f in findings if f.reason != "InflightGaugeStuck"]
    return replace(
        detection,
        findings=tuple(findings),
        stalled_decodes=(detection.stalled_decodes - waiting) | dead,
        healthy_decodes=detection.healthy_decodes - dead,
        canaries=canaries,
    )
