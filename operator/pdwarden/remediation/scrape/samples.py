"""One internal shape for a worker's queue metrics, whichever engine produced them.

Why: detection must not care whether a pod runs pdworker or stock SGLang. What each engine's
series mean lives in `engines`; this module turns a /metrics body into a `Sample` with
it. Every byte is hostile: the body size, line length, label-value length and series count are
bounded, lines of series no adapter needs are dropped by their name before anything else is
looked at, and the rest is read by a small line parser whose cost is linear in the input
(prometheus-client's parser costs ~1 us per escaped character and is not bounded). Anything
unusable becomes a `ScrapeError`, never an exception that reaches a handler.
"""

from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, replace
from typing import Any, Final

from pdwarden.remediation.scrape import engines as engine_metrics
from pdworker import contract as pdw

QUEUE_FIELDS: Final = ("bootstrap_queue", "inflight_queue", "prealloc_queue", "transfer_queue")
MAX_TEXT_BYTES: Final = 4 * 1024 * 1024
MAX_LINE_CHARS: Final = 4096  # of a line the parser keeps
MAX_LABEL_VALUE_CHARS: Final = 512
MAX_LABELS: Final = 32  # per series
MAX_SERIES: Final = 8192  # kept lines per body

_NAME: Final = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
# One `name="value"` pair and what follows it; the value pattern is the unrolled loop of
# `([^"\\]|\\.)*`, which never backtracks.
_LABEL: Final = re.compile(
    r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"([^"\\\n]*(?:\\.[^"\\\n]*)*)"[ \t]*([,}])'
)
_CLOSE: Final = re.compile(r"[ \t]*\}")  # `}` after a trailing comma


class ScrapeError(ValueError):
    """A pod's /metrics answer could not be used (garbage, truncated, or none of our metrics)."""


@dataclass(frozen=True)
class Sample:
    """A worker's queue state at one moment. None = the engine does not report that metric.

    Counters (`engine_metrics.COUNTER_FIELDS`) are compared between samples: any change is
    movement. `generated_tokens` is only ever fed by a counter that moves on every decode step.
    """

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
    waiting_queue: float | None = None  # requests waiting for a forward pass
    prefill_tokens: float | None = None  # prompt tokens computed (moves per prefill step)
    kv_transfers: float | None = None  # rooms whose KV transfer finished (sent or received)

    def queue(self, name: str) -> float:
        value = getattr(self, name)
        return float(value) if value is not None else 0.0


def parse_metrics(text: str, at: float, engine: str | None = None) -> Sample:
    """Map a /metrics body onto a Sample; raise ScrapeError if it is not usable.

    `engine` picks the adapter (None: both, for callers that do not know; each body carries
    one engine's names). Only series the adapter names are parsed at all.
    """
    if len(text) > MAX_TEXT_BYTES:
        raise ScrapeError(f"metrics body too large ({len(text)} bytes)")
    if text and not text.endswith("\n"):
        raise ScrapeError("metrics body does not end with a newline (cut short?)")
    adapter = engine_metrics.engine(engine)
    by_name = adapter.by_name()
    found = read_series(text, adapter.names() | {pdw.INCARNATION_INFO})
    incarnation: str | None = None
    for labels, value in found.pop(pdw.INCARNATION_INFO, []):
        if value == 1:
            incarnation = labels.get("incarnation") or incarnation
    for name, samples in found.items():
        for labels, value in samples:
            if not math.isfinite(value) and any(s.matches(labels) for s in by_name[name]):
                # NaN never compares as stuck and +Inf overflows int(): neither is a length.
                raise ScrapeError(f"{name} is not a finite number ({value})")
    values: dict[str, Any] = {}
    for name, samples in found.items():
        for series in by_name[name]:
            v = engine_metrics.combine(series, samples)
            if v is not None:
                values[series.target] = values.get(series.target, 0.0) + v
    if not values and incarnation is None:
        raise ScrapeError("no pdworker or SGLang queue metrics in the answer")
    return replace(Sample(at=at, incarnation=incarnation), **values)


def read_series(
    text: str, names: AbstractSet[str]
) -> dict[str, list[tuple[dict[str, str], float]]]:
    """The samples of the named series, by name; every other line is skipped by its name alone.

    Cost is linear in len(text): a line is looked at past its name only if the name is wanted,
    and then it is bounded (MAX_LINE_CHARS, MAX_LABEL_VALUE_CHARS, MAX_LABELS, MAX_SERIES).
    """
    found: dict[str, list[tuple[dict[str, str], float]]] = {}
    kept = 0
    for number, line in enumerate(text.split("\n"), 1):
        if not line or line[0] == "#":
            continue
        m = _NAME.match(line)
        if m is None or m.group() not in names:
            continue
        name = m.group()
        kept += 1
        if kept > MAX_SERIES:
            raise ScrapeError(f"more than {MAX_SERIES} series of the names we read")
        if len(line) > MAX_LINE_CHARS:
            raise ScrapeError(f"line {number} ({name}) longer than {MAX_LINE_CHARS} characters")
        found.setdefault(name, []).append(_sample_line(line, m.end(), number))
    return found


def _unescape(raw: str) -> str:
    """The text format's three escapes (backslash, quote, newline), in C-speed passes."""
    return "\\".join(p.replace('\\"', '"').replace("\\n", "\n") for p in raw.split("\\\\"))


def _sample_line(line: str, pos: int, number: int) -> tuple[dict[str, str], float]:
    """Labels and value of one `name{labels} value [timestamp]` line, in linear time."""
    labels: dict[str, str] = {}
    if pos < len(line) and line[pos] == "{":
        pos += 1
        if line[pos : pos + 1] == "}":
            pos += 1
        else:
            while True:
                m = _LABEL.match(line, pos)
                if m is None:
                    raise ScrapeError(f"line {number}: malformed labels")
                key, raw, end = m.groups()
                if len(raw) > MAX_LABEL_VALUE_CHARS or len(labels) >= MAX_LABELS:
                    raise ScrapeError(f"line {number}: label value or label count over limit")
                labels[key] = _unescape(raw) if "\\" in raw else raw
                pos = m.end()
                if end == "}":
                    break
                close = _CLOSE.match(line, pos)
                if close is not None:
                    pos = close.end()
                    break
    rest = line[pos:].split()
    if not rest or len(rest) > 2 or (line[pos : pos + 1] not in (" ", "\t")):
        raise ScrapeError(f"line {number}: expected a value after the series name")
    try:
        return labels, float(rest[0])
    except ValueError:
        raise ScrapeError(f"line {number}: value {rest[0][:32]!r} is not a number") from None


@dataclass(frozen=True)
class RoomView:
    """One live room as a pdworker prefill's admin API reports it."""

    room: int
    phase: str
    phase_seconds: float
    peer_pod: str | None  # the peer's own word until the shell attributes it by verified IP
    peer_incarnation: str | None
    peer_ip: str | None = None  # the address the prefill verified the peer's handshake from


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
                    peer_pod=_optional_str(peer.get(pdw.ROOM_PEER_POD_HINT)),
                    peer_incarnation=_optional_str(peer.get("incarnation")),
                    peer_ip=_ip_literal(peer.get(pdw.ROOM_PEER_VERIFIED_IP)),
                )
            )
            if not math.isfinite(rooms[-1].phase_seconds):
                raise ValueError(f"phase_seconds {rooms[-1].phase_seconds} is not finite")
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as e:
        raise ScrapeError(f"malformed room in admin answer: {e!r}") from None
    return rooms


def _ip_literal(value: Any) -> str | None:
    """An IP address in its canonical spelling, or None for anything else."""
    if not isinstance(value, str) or len(value) > 45:
        return None
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        return None


def _room_id(value: Any) -> int:
    # int() would turn 1.5 into room 1 (and then fail the wrong room) and True into 1;
    # str.isdigit() accepts "²", which int() refuses.
    if isinstance(value, str) and value.isascii() and value.isdigit():
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
