"""What every wedge rule reads and returns: a pod's view, a finding, the window helpers.

Why a module: rules.py (engines whose prefill pushes KV) and pull.py (engines whose decode pulls
it, vLLM) are rule sets over the same evidence; it sits below both so neither imports the other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from pdwarden.values import RoomView, Sample

Reason = Literal[
    "InflightStuck", "PeerIncarnationGone", "InflightGaugeStuck", "DecodeStalled",
    # A push engine without a rooms API (SGLang): its transfers fail and none succeeds.
    "TransfersFailing",
    # Engines whose decode pulls KV (vLLM): detect/pull.py.
    "KVReadStuck", "LeaseExpired", "LateNotification", "PromptsRecomputed",
    # A pair canary (confirm/pair_canary.py) got no answer from that side's leg.
    "PrefillDead", "DecodeDead",
]  # fmt: skip


@dataclass(frozen=True)
class PodView:
    """Everything detection knows about one worker pod."""

    name: str
    role: str
    uid: str
    history: tuple[Sample, ...] = ()  # fresh samples, oldest first, newest last
    rooms: tuple[RoomView, ...] | None = None  # pdworker prefill only
    stale: bool = False
    error: str | None = None
    # pdworker prefill only: (sample time, `working_rooms`) of this and earlier scrapes, oldest
    # first, so a decode that was waited on anywhere in the window is not judged on one list.
    recent_rooms: tuple[tuple[float, tuple[RoomView, ...]], ...] = ()
    # Prefill only: rooms may sit in the inflight queue until a decode allocates KV for them
    # (`engines.sglang_flags`), so a decode short of KV slots excuses a queue that does not drain.
    # True when unknown: the excuse can only delay a finding, never make one.
    rooms_wait_for_decode_kv: bool = True
    # When memory last saw its inflight queue empty, or first saw the pod (None: not known): a
    # queue holding rooms now has held some since then, however far back past `history`.
    inflight_empty_at: float | None = None

    @property
    def latest(self) -> Sample | None:
        return self.history[-1] if self.history else None


@dataclass(frozen=True)
class Finding:
    pod: str
    role: str
    reason: Reason
    rooms: tuple[int, ...] = ()
    room_count: int = 0
    oldest_seconds: float = 0.0
    peer: str | None = None
    evidence: str = ""
    # Pods that may be the cause when no metric names the peer (detect/pull.py): a repair
    # confirms each with a canary before acting on it.
    suspects: tuple[str, ...] = ()
    # A suspicion a pair canary has since confirmed (TransfersFailing: `decide.pairs`); only a
    # confirmed one is repaired. Not part of `identity`: confirming it makes no new wedge.
    confirmed: bool = False

    @property
    def identity(self) -> tuple[str, str, str]:
        """Which wedge this is, the same in every cycle while it lasts: the pod, the reason, and
        the peer only where a metric named it (a prefill's rooms). Suspects, and a peer that is
        merely the one suspect left, change while a wedge lasts (measured: a decode's stuck read
        named the prefill, then two prefills, then the new one, as the restarted prefill went
        away), and so does the evidence text; none of them makes it another wedge."""
        return (self.pod, self.reason, "" if self.suspects else (self.peer or ""))


def window_of(history: Sequence[Sample], seconds: float) -> Sequence[Sample] | None:
    """The samples of the last `seconds`, or None if history does not yet span that long."""
    if len(history) < 2 or history[-1].at - history[0].at < seconds:
        return None
    start = history[-1].at - seconds
    first = max(i for i, s in enumerate(history) if s.at <= start)
    return history[first:]


def moved(window: Sequence[Sample], name: str) -> bool:
    """A counter changed inside the window (appeared, rose, or dropped: a reset by a new
    process). Any movement is progress; a counter that was never reported did not move."""
    return len({getattr(s, name) for s in window}) > 1
