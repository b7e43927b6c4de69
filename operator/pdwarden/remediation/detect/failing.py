"""TransfersFailing: a push pair whose KV transfers fail while both sides stay in sight.

Why apart from rules.py: it is the one rule that reads failures as the symptom rather than as a
drain, and it shares with the gauge rule only the question whether every decode was in sight
over the window (`in_sight`), which lives here below both. See rules.py for the rule set.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

from pdwarden.remediation.detect.evidence import PodView, moved, window_of
from pdwarden.values import Sample


def in_sight(decodes: Sequence[PodView], window: Sequence[Sample]) -> bool:
    """Every decode pod was fresh over the window: none is stale now, and none has a gap in its
    samples longer than a few of the prefill's own scrape intervals (a decode killed and back
    within the window)."""
    start, end = window[0].at, window[-1].at
    gap = 3 * (end - start) / max(len(window) - 1, 1) + 1
    return not any(d.stale or out_of_sight(d, start, end, gap) for d in decodes)


def out_of_sight(view: PodView, start: float, end: float, gap: float) -> bool:
    """Whether the pod's samples leave a hole longer than `gap` anywhere in [start, end]."""
    if not view.history or view.history[0].at > start:
        return True
    seen = [start, *(s.at for s in view.history if start < s.at <= end), end]
    return any(b - a > gap for a, b in pairwise(seen))


# Scrapes of the window at which a prefill's failure counters rose, at least, for
# TransfersFailing: failures that keep coming, not one burst (pdwarden's own AbortRequests, or a
# decode's death, fails every room at once).
FAILED_SCRAPES = 2


def transfers_failing(
    history: Sequence[Sample], window_seconds: float, decodes: Sequence[PodView]
) -> str | None:
    """Evidence text if a push prefill without a rooms API (SGLang) failed KV transfers at
    FAILED_SCRAPES scrapes or more of the window and completed none, while every decode pod was
    in sight all along (a decode that is away fails its rooms legitimately: the kubelet's repair,
    or ours on a dead verdict). A suspicion only: client aborts count as failures too, so a pair
    canary must confirm that no KV moves before anything acts (`decide.pairs`)."""
    window = window_of(history, window_seconds)
    if window is None or any(s.inflight_queue is None for s in window):
        return None  # not a push engine's prefill
    failed = [s.failed for s in window]
    rises = sum(b is not None and (a is None or b > a) for a, b in pairwise(failed))
    if rises < FAILED_SCRAPES or moved(window, "kv_transfers"):
        return None
    if not decodes or not in_sight(decodes, window):
        return None
    first, last = window[0], window[-1]
    count = (last.failed or 0) - (first.failed or 0)
    return (
        f"{count:g} KV transfers failed at {rises} scrapes in {last.at - first.at:.0f}s and none "
        f"succeeded (transfers flat at {last.kv_transfers or 0:g}) while every decode pod was "
        f"in sight"
    )
