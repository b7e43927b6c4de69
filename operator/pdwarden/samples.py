"""One internal shape for a worker's queue metrics, whichever engine produced them.

Why: detection must not care whether a pod runs pdworker or stock SGLang. This module parses
Prometheus text with prometheus-client's own parser and maps each engine's names onto `Sample`;
anything unparsable becomes a `ScrapeError`, never an exception that reaches a handler.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final

from prometheus_client.parser import text_string_to_metric_families

from pdworker import contract as pdw

# Engine metric name -> Sample field. Counters are listed with their sample name (`_total`).
PDWORKER_NAMES: Final[Mapping[str, str]] = {
    pdw.PREFILL_BOOTSTRAP_QUEUE: "bootstrap_queue",
    pdw.PREFILL_INFLIGHT_QUEUE: "inflight_queue",
    pdw.PREFILL_INFLIGHT_OLDEST: "inflight_oldest_seconds",
    pdw.DECODE_PREALLOC_QUEUE: "prealloc_queue",
    pdw.DECODE_TRANSFER_QUEUE: "transfer_queue",
    pdw.DECODE_RUNNING: "running",
    pdw.GENERATED_TOKENS: "generated_tokens",
    pdw.REQUESTS_COMPLETED: "completed",
    pdw.REQUESTS_FAILED: "failed",
}
SGLANG_NAMES: Final[Mapping[str, str]] = {
    "sglang:num_prefill_bootstrap_queue_reqs": "bootstrap_queue",
    "sglang:num_prefill_prealloc_queue_reqs": "bootstrap_queue",  # the older name of the same
    "sglang:num_prefill_inflight_queue_reqs": "inflight_queue",
    "sglang:num_decode_prealloc_queue_reqs": "prealloc_queue",
    "sglang:num_decode_transfer_queue_reqs": "transfer_queue",
    "sglang:num_running_reqs": "running",
    "sglang:generation_tokens_total": "generated_tokens",
    "sglang:num_bootstrap_failed_reqs_total": "failed",
    "sglang:num_transfer_failed_reqs_total": "failed",
}
# sglang reports decode progress as a throughput gauge rather than a token counter.
SGLANG_THROUGHPUT: Final = "sglang:gen_throughput"
QUEUE_FIELDS: Final = ("bootstrap_queue", "inflight_queue", "prealloc_queue", "transfer_queue")
MAX_TEXT_BYTES: Final = 4 * 1024 * 1024


class ScrapeError(ValueError):
    """A pod's /metrics answer could not be used (garbage, truncated, or none of our metrics)."""


@dataclass(frozen=True)
class Sample:
    """A worker's queue state at one moment. None = the engine does not report that metric."""

    at: float
    bootstrap_queue: float | None = None
    inflight_queue: float | None = None
    inflight_oldest_seconds: float | None = None
    prealloc_queue: float | None = None
    transfer_queue: float | None = None
    running: float | None = None
    generated_tokens: float | None = None
    throughput: float | None = None
    completed: float | None = None
    failed: float | None = None
    incarnation: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def queue(self, name: str) -> float:
        value = getattr(self, name)
        return float(value) if value is not None else 0.0


def parse_metrics(text: str, at: float) -> Sample:
    """Map a /metrics body onto a Sample; raise ScrapeError if it is not usable."""
    if len(text) > MAX_TEXT_BYTES:
        raise ScrapeError(f"metrics body too large ({len(text)} bytes)")
    values: dict[str, float] = {}
    incarnation: str | None = None
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == pdw.INCARNATION_INFO and s.value == 1:
                    incarnation = s.labels.get("incarnation") or incarnation
                    continue
                if s.name == SGLANG_THROUGHPUT:
                    values["throughput"] = values.get("throughput", 0.0) + _finite(s.name, s.value)
                    continue
                target = PDWORKER_NAMES.get(s.name) or SGLANG_NAMES.get(s.name)
                if target is not None:
                    values[target] = values.get(target, 0.0) + _finite(s.name, s.value)
    except (ValueError, TypeError, IndexError, KeyError) as e:
        raise ScrapeError(f"unparsable metrics: {e}") from None
    if not values and incarnation is None:
        raise ScrapeError("no pdworker or SGLang queue metrics in the answer")
    fields: dict[str, Any] = dict(values)
    return replace(Sample(at=at, incarnation=incarnation), **fields)


def _finite(name: str, value: float) -> float:
    # NaN never compares as stuck and +Inf overflows int(): neither is a queue length.
    if not math.isfinite(value):
        raise ScrapeError(f"{name} is not a finite number ({value})")
    return float(value)


@dataclass(frozen=True)
class RoomView:
    """One live room as a pdworker prefill's admin API reports it."""

    room: int
    phase: str
    phase_seconds: float
    peer_pod: str | None
    peer_incarnation: str | None


def parse_rooms(data: Any) -> list[RoomView]:
    """Validate GET /admin/rooms; raise ScrapeError for anything malformed."""
    items = data.get("rooms") if isinstance(data, dict) else data
    if not isinstance(items, list):
        raise ScrapeError("admin rooms answer is not a list")
    rooms = []
    try:
        for item in items:
            peer = item.get("peer") or {}
            rooms.append(
                RoomView(
                    room=_room_id(item["room"]),
                    phase=str(item["phase"]),
                    phase_seconds=float(item["phase_seconds"]),
                    peer_pod=_optional_str(peer.get("pod")),
                    peer_incarnation=_optional_str(peer.get("incarnation")),
                )
            )
            if not math.isfinite(rooms[-1].phase_seconds):
                raise ValueError(f"phase_seconds {rooms[-1].phase_seconds} is not finite")
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as e:
        raise ScrapeError(f"malformed room in admin answer: {e!r}") from None
    return rooms


def _room_id(value: Any) -> int:
    # int() would turn 1.5 into room 1 (and then fail the wrong room) and True into 1.
    if isinstance(value, str) and value.isdigit():
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise ValueError(f"room must be a non-negative integer, got {value!r}")


def _optional_str(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise TypeError(f"expected a string, got {value!r}")


def nonzero_queues(sample: Sample, fields: Iterable[str] = QUEUE_FIELDS) -> dict[str, float]:
    return {f: sample.queue(f) for f in fields if sample.queue(f) > 0}
