"""One internal shape for a worker's queue metrics, whichever engine produced them.

Why: detection must not care which engine a pod runs. What each engine's series mean lives in
its engine module (`pdwarden.engines`); this module turns a /metrics body into a `Sample` with
it. Every byte is hostile: the body size, line length, label-value length and series count are
bounded, lines of series no adapter needs are dropped by their name before anything else is
looked at, and the rest is read by a small line parser whose cost is linear in the input
(prometheus-client's parser costs ~1 us per escaped character and is not bounded). Anything
unusable becomes a `ScrapeError`, never an exception that reaches a handler.
"""

from __future__ import annotations

import ipaddress
import json
import math
import re
import string
import time
from collections.abc import Generator, Iterable
from collections.abc import Set as AbstractSet
from dataclasses import replace
from typing import Any, Final, TypeVar, cast

from pdwarden import engines
from pdwarden.values import RoomView, Sample
from pdworker import contract as pdw

QUEUE_FIELDS: Final = ("bootstrap_queue", "inflight_queue", "prealloc_queue", "transfer_queue")
MAX_TEXT_BYTES: Final = 16 * 1024 * 1024  # the hard maximum of `--max-metrics-bytes`
MAX_LINE_CHARS: Final = 4096  # of a line the parser keeps
MAX_LABEL_VALUE_CHARS: Final = 512
MAX_LABELS: Final = 32  # per series
MAX_SERIES: Final = 8192  # kept lines per body
# A parse gives the event loop a turn after this much work (checked every few kept lines): a
# body of many costly lines is cut in slices this long, a benign one is parsed in one go.
STEP_SECONDS: Final = 0.0005

# One `name="value"` pair and what follows it; the value pattern is the unrolled loop of
# `([^"\\]|\\.)*`, which never backtracks.
_LABEL: Final = re.compile(
    r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"([^"\\\n]*(?:\\.[^"\\\n]*)*)"[ \t]*([,}])'
)
_CLOSE: Final = re.compile(r"[ \t]*\}")  # `}` after a trailing comma


class ScrapeError(ValueError):
    """A pod's /metrics answer could not be used (garbage, truncated, or none of our metrics)."""


def parse_metrics(text: str, at: float, engine: str | None = None) -> Sample:
    """Map a /metrics body onto a Sample; raise ScrapeError if it is not usable.

    `engine` picks the adapter (None: both, for callers that do not know; each body carries
    one engine's names). Only series the adapter names are parsed at all.
    """
    return run_steps(parse_steps(text, at, engine))


def parse_steps(text: str, at: float, engine: str | None = None) -> Steps[Sample]:
    """`parse_metrics` in steps: it yields after about STEP_SECONDS of work, so a caller on an
    event loop can give other work a turn, or stop (cancel) a parse between two steps."""
    if len(text) > MAX_TEXT_BYTES:
        raise ScrapeError(f"metrics body too large ({len(text)} bytes)")
    if text and not text.endswith("\n"):
        raise ScrapeError("metrics body does not end with a newline (cut short?)")
    found = yield from series_steps(text, wanted_names(engine))
    return sample_of(found, at, engine)


def wanted_names(engine: str | None = None) -> frozenset[str]:
    """The series names a Sample is made of: the engine's (or every engine's) and pdworker's
    incarnation."""
    return frozenset(engines.metrics(engine).names() | {pdw.INCARNATION_INFO})


def sample_of(found: Found, at: float, engine: str | None = None) -> Sample:
    """The Sample the series `found` (by name, as `read_series` returns them) make; raise
    ScrapeError if none of them is usable. Shared by the text parser and the Prometheus screen
    (`scrape.screen`), so a pod reads the same whoever scraped it."""
    by_name = engines.metrics(engine).by_name()
    found = {name: samples for name, samples in found.items() if samples}
    incarnation: str | None = None
    for labels, value in found.pop(pdw.INCARNATION_INFO, []):
        if value == 1:
            incarnation = labels.get("incarnation") or incarnation
    for name, samples in found.items():
        for labels, value in samples:
            if not math.isfinite(value) and any(s.matches(labels) for s in by_name.get(name, ())):
                # NaN never compares as stuck and +Inf overflows int(): neither is a length.
                raise ScrapeError(f"{name} is not a finite number ({value})")
    values: dict[str, Any] = {}
    for name, samples in found.items():
        for series in by_name.get(name, ()):
            v = engines.combine(series, samples)
            if v is not None:
                values[series.target] = values.get(series.target, 0.0) + v
    if not values and incarnation is None:
        raise ScrapeError("no pdworker, SGLang or vLLM queue metrics in the answer")
    return replace(Sample(at=at, incarnation=incarnation), **values)


T = TypeVar("T")
Steps = Generator[None, None, T]
Found = dict[str, list[tuple[dict[str, str], float]]]


def run_steps(steps: Steps[T]) -> T:
    """Drive a stepwise parse to its end in one go (tests, small inputs)."""
    try:
        while True:
            next(steps)
    except StopIteration as done:
        return cast(T, done.value)


# Characters of a metric name: a wanted name at a line start followed by none of these is that
# whole name (a sample line of it, or a malformed one), not the prefix of another name.
_NAME_CHARS: Final = frozenset(string.ascii_letters + string.digits + "_:")


def line_starts(text: str, names: AbstractSet[str]) -> list[tuple[int, str]]:
    """Where lines of the wanted names start, in text order, found by C-speed substring search
    (such a line is a newline followed by the name): one pass per wanted name, whatever the
    body's line structure, and lines of other names are never visited."""
    found: list[tuple[int, str]] = []
    for name in names:
        needle = "\n" + name
        start = 0 if text.startswith(name) else _next_line(text, needle, 0)
        while start >= 0:
            end = start + len(name)
            if end == len(text) or text[end] not in _NAME_CHARS:
                found.append((start, name))
                if len(found) > MAX_SERIES:
                    raise ScrapeError(f"more than {MAX_SERIES} series of the names we read")
            start = _next_line(text, needle, end)
    found.sort()
    return found


def _next_line(text: str, needle: str, pos: int) -> int:
    at = text.find(needle, pos)
    return at + 1 if at >= 0 else -1


def read_series(text: str, names: AbstractSet[str]) -> Found:
    """The samples of the named series, by name; every other line is skipped unread."""
    return run_steps(series_steps(text, names))


def series_steps(text: str, names: AbstractSet[str]) -> Steps[Found]:
    """`read_series` in steps of about STEP_SECONDS each.

    Lines of names nobody reads are never visited by Python code (`line_starts`). Each kept
    line is bounded (MAX_LINE_CHARS, MAX_LABEL_VALUE_CHARS, MAX_LABELS) and so is their number
    (MAX_SERIES), so a step overruns STEP_SECONDS by at most a few bounded lines.
    """
    found: Found = {}
    step_ends = time.perf_counter() + STEP_SECONDS
    for kept, (start, name) in enumerate(line_starts(text, names), 1):
        end = text.find("\n", start)
        line = text[start : end if end >= 0 else len(text)]
        if len(line) > MAX_LINE_CHARS:
            raise ScrapeError(
                f"line {_line_number(text, start)} ({name}) longer than {MAX_LINE_CHARS} characters"
            )
        try:
            found.setdefault(name, []).append(_sample_line(line, len(name)))
        except _BadLine as e:
            raise ScrapeError(f"line {_line_number(text, start)}: {e}") from None
        if kept % 8 == 0 and time.perf_counter() >= step_ends:
            yield
            step_ends = time.perf_counter() + STEP_SECONDS
    return found


def _line_number(text: str, pos: int) -> int:
    """Counted only when a line is reported (an error), never per line."""
    return text.count("\n", 0, pos) + 1


class _BadLine(ValueError):
    """One kept line is malformed (the caller names its line number)."""


def _unescape(raw: str) -> str:
    """The text format's three escapes (backslash, quote, newline), in C-speed passes."""
    return "\\".join(p.replace('\\"', '"').replace("\\n", "\n") for p in raw.split("\\\\"))


def _sample_line(line: str, pos: int) -> tuple[dict[str, str], float]:
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
                    raise _BadLine("malformed labels")
                key, raw, end = m.groups()
                if len(raw) > MAX_LABEL_VALUE_CHARS or len(labels) >= MAX_LABELS:
                    raise _BadLine("label value or label count over limit")
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
        raise _BadLine("expected a value after the series name")
    try:
        return labels, float(rest[0])
    except ValueError:
        raise _BadLine(f"value {rest[0][:32]!r} is not a number") from None


def json_answer(raw: bytes, what: str, error: type[ValueError] = ScrapeError) -> Any:
    """`raw` decoded as JSON; anything else (or nesting past the recursion limit) is `error`
    naming `what`."""
    try:
        return json.loads(raw)
    except RecursionError:
        raise error(f"{what} is nested too deeply") from None
    except ValueError as e:
        raise error(f"{what} is not JSON: {e}") from None


def parse_rooms(data: Any) -> list[RoomView]:
    """Validate GET /admin/rooms; raise ScrapeError for anything malformed."""
    items = data.get(pdw.ROOMS_KEY) if isinstance(data, dict) else data
    if not isinstance(items, list):
        raise ScrapeError("admin rooms answer is not a list")
    rooms = []
    try:
        for item in items:
            peer = item.get(pdw.ROOM_PEER) or {}
            rooms.append(
                RoomView(
                    room=_room_id(item[pdw.ROOM_ID]),
                    phase=str(item[pdw.ROOM_PHASE]),
                    phase_seconds=float(item[pdw.ROOM_PHASE_SECONDS]),
                    peer_pod=_optional_str(peer.get(pdw.ROOM_PEER_POD_HINT)),
                    peer_incarnation=_optional_str(peer.get(pdw.ROOM_PEER_INCARNATION)),
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
