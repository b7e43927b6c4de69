"""samples: Prometheus text and the admin rooms answer -> Sample / RoomView, or ScrapeError.

The pdworker bodies in data/ were captured from pdworker's own WorkerMetrics and RoomTable; the
SGLang bodies follow SGLang's metric names and labels (old and new prefill queue names).
"""

from __future__ import annotations

import contextlib
import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pdwarden.samples import (
    MAX_TEXT_BYTES,
    RoomView,
    Sample,
    ScrapeError,
    nonzero_queues,
    parse_metrics,
    parse_rooms,
)

DATA = Path(__file__).parent / "data"


def body(name: str) -> str:
    return (DATA / name).read_text()


# -- pdworker ------------------------------------------------------------------------------


def test_pdworker_prefill_body_maps_queues_counters_and_incarnation() -> None:
    s = parse_metrics(body("pdworker_prefill.prom"), at=100.0)
    assert s.at == 100.0
    assert s.bootstrap_queue == 1 and s.inflight_queue == 2
    assert s.inflight_oldest_seconds == pytest.approx(75.0, abs=0.1)
    assert s.completed == 42
    assert s.failed == 3  # summed over every `reason` label
    assert s.incarnation == "inc-p0-1234"
    assert nonzero_queues(s) == {"bootstrap_queue": 1.0, "inflight_queue": 2.0}


def test_pdworker_decode_body_maps_decode_queues_and_tokens() -> None:
    s = parse_metrics(body("pdworker_decode.prom"), at=1.0)
    assert (s.prealloc_queue, s.transfer_queue, s.running) == (0, 1, 2)
    assert s.generated_tokens == 5120
    assert s.incarnation == "inc-d1-aaaa"
    assert s.throughput is None  # pdworker reports progress as a counter only


def test_pdworker_live_registry_still_parses() -> None:
    """Guards against the worker renaming a metric: parse what WorkerMetrics renders today."""
    from pdworker.metrics import WorkerMetrics
    from pdworker.rooms import RoomTable

    table = RoomTable("prefill")
    table.create(5, "inflight", now=0.0)
    text = WorkerMetrics("prefill", "inc-live", table).render().decode()
    s = parse_metrics(text, at=0.0)
    assert s.inflight_queue == 1 and s.incarnation == "inc-live"


def test_incarnation_alone_is_usable() -> None:
    text = 'pdworker_incarnation_info{incarnation="i-1",role="decode"} 1.0\n'
    assert parse_metrics(text, 0).incarnation == "i-1"


def test_incarnation_with_value_zero_is_ignored() -> None:
    text = (
        'pdworker_incarnation_info{incarnation="old",role="decode"} 0\n'
        "pdworker_decode_running_reqs 1\n"
    )
    assert parse_metrics(text, 0).incarnation is None


# -- SGLang --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["sglang_prefill_old.prom", "sglang_prefill_new.prom"])
def test_sglang_prefill_old_and_new_bootstrap_names(name: str) -> None:
    s = parse_metrics(body(name), at=5.0)
    assert s.bootstrap_queue == 2
    assert s.inflight_queue == 3
    assert s.running == 0 and s.throughput == 0
    assert s.failed == 3  # bootstrap + transfer failed counters
    assert s.incarnation is None
    assert s.generated_tokens is None  # not in this body: None, not 0


def test_sglang_bodies_differ_only_in_the_bootstrap_name() -> None:
    old, new = body("sglang_prefill_old.prom"), body("sglang_prefill_new.prom")
    assert "prefill_prealloc_queue" in old and "prefill_prealloc_queue" not in new
    assert parse_metrics(old, 1) == parse_metrics(new, 1)


def test_sglang_decode_sums_data_parallel_ranks() -> None:
    s = parse_metrics(body("sglang_decode.prom"), at=0)
    assert s.running == 24
    assert (s.prealloc_queue, s.transfer_queue) == (1, 4)
    assert s.throughput == 812.5
    assert s.generated_tokens == 1_234_567


def test_unreported_queue_reads_as_zero_but_stays_none() -> None:
    s = parse_metrics("sglang:num_running_reqs 3\n", 0)
    assert s.inflight_queue is None and s.queue("inflight_queue") == 0.0
    assert nonzero_queues(s, ["inflight_queue", "running"]) == {"running": 3.0}


# -- unusable bodies -----------------------------------------------------------------------

GARBAGE = {
    "empty": "",
    "whitespace": "\n\n   \n",
    "html error page": "<html><body><h1>502 Bad Gateway</h1></body></html>",
    "json": '{"error": "not found"}',
    "only unrelated metrics": "# TYPE up gauge\nup 1\nprocess_cpu_seconds_total 3.5\n",
    "value not a number": "pdworker_prefill_inflight_queue_reqs lots\n",
    "truncated name": "pdworker_prefill_inflight_queue_reqs 1\npdworker_prefill_inf",
    "truncated labels": 'pdworker_requests_failed_total{reason="abor',
    "truncated help": "# HELP pdworker_prefill_inflight_queue_reqs",
    "binary": "\x00\x01\x02\xff\xfe",
    "bad type": "# TYPE pdworker_prefill_inflight_queue_reqs wibble\n",
    "duplicate type": (
        "# TYPE pdworker_decode_running_reqs gauge\n# TYPE pdworker_decode_running_reqs gauge\n"
    ),
}


@pytest.mark.parametrize("text", list(GARBAGE.values()), ids=list(GARBAGE))
def test_garbage_is_a_scrape_error(text: str) -> None:
    with pytest.raises(ScrapeError):
        parse_metrics(text, 0)


def test_truncation_anywhere_is_a_sample_or_scrape_error() -> None:
    text = body("pdworker_prefill.prom")
    for cut in range(0, len(text), 7):
        with contextlib.suppress(ScrapeError):
            assert isinstance(parse_metrics(text[:cut], 0), Sample)


def test_huge_body_is_refused_before_parsing() -> None:
    line = "pdworker_decode_running_reqs 1\n"
    text = line * (MAX_TEXT_BYTES // len(line) + 1)
    with pytest.raises(ScrapeError, match="too large"):
        parse_metrics(text, 0)


@pytest.mark.parametrize("value", ["NaN", "+Inf", "-Inf"])
def test_non_finite_queue_values_are_scrape_errors(value: str) -> None:
    """A gauge of +Inf would reach int() in detection; NaN would never compare as wedged."""
    with pytest.raises(ScrapeError, match="not a finite"):
        parse_metrics(f"pdworker_prefill_inflight_queue_reqs {value}\n", 0)


def test_non_finite_value_of_an_unmapped_metric_is_harmless() -> None:
    text = "pdworker_kv_transfer_seconds_sum NaN\npdworker_decode_running_reqs 1\n"
    assert parse_metrics(text, 0).running == 1


_METRIC_TOKENS = st.sampled_from(
    [*'abcdefgsxyz_:{}=",.0123456789 \n\t#+-eE', "\\", "NaN", "Inf", "\x00", "é"]
)
_METRIC_TEXT = st.lists(_METRIC_TOKENS, max_size=40).map("".join)
_PREFIXES = st.sampled_from(
    [
        "",
        "pdworker_prefill_inflight_queue_reqs ",
        'pdworker_incarnation_info{incarnation="',
        "sglang:num_running_reqs{",
        "# TYPE pdworker_decode_running_reqs ",
        "# HELP x ",
    ]
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(_PREFIXES, _METRIC_TEXT), max_size=8))
def test_fuzz_metric_like_text_only_yields_sample_or_scrape_error(
    parts: list[tuple[str, str]],
) -> None:
    text = "\n".join(p + rest for p, rest in parts)
    _sample_or_scrape_error(text)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_fuzz_arbitrary_text_only_yields_sample_or_scrape_error(text: str) -> None:
    _sample_or_scrape_error(text)


def _sample_or_scrape_error(text: str) -> None:
    try:
        s = parse_metrics(text, 1.0)
    except ScrapeError:
        return
    assert isinstance(s, Sample)
    for name in ("bootstrap_queue", "inflight_queue", "prealloc_queue", "transfer_queue"):
        assert math.isfinite(s.queue(name))


# -- admin rooms ---------------------------------------------------------------------------


def test_rooms_captured_from_pdworker() -> None:
    rooms = parse_rooms(json.loads(body("pdworker_prefill_rooms.json")))
    assert [r.room for r in rooms] == [101, 102, 103]
    assert rooms[0] == RoomView(101, "bootstrap", 0.0, None, None)
    assert rooms[1].phase == "inflight" and rooms[1].phase_seconds == pytest.approx(75, abs=0.1)
    assert (rooms[1].peer_pod, rooms[1].peer_incarnation) == ("demo-decode-1", "inc-d1-aaaa")


def test_rooms_may_be_wrapped_in_an_object() -> None:
    room = {"room": "7", "phase": "inflight", "phase_seconds": 1}
    assert parse_rooms({"rooms": [room]})[0].room == 7
    assert parse_rooms([]) == []


_ROOM = {"room": 1, "phase": "inflight", "phase_seconds": 2.0, "peer": None}
MALFORMED: dict[str, Any] = {
    "none": None,
    "string": "rooms",
    "number": 3,
    "object without rooms": {"items": []},
    "rooms not a list": {"rooms": {"1": _ROOM}},
    "item not an object": [1, 2],
    "item a string": ["room"],
    "missing room": [{"phase": "inflight", "phase_seconds": 1}],
    "missing phase": [{"room": 1, "phase_seconds": 1}],
    "missing phase_seconds": [{"room": 1, "phase": "inflight"}],
    "room not a number": [{**_ROOM, "room": "abc"}],
    "room null": [{**_ROOM, "room": None}],
    "room infinite": [{**_ROOM, "room": math.inf}],
    "room NaN": [{**_ROOM, "room": math.nan}],
    "room fractional": [{**_ROOM, "room": 1.5}],
    "room boolean": [{**_ROOM, "room": True}],
    "phase_seconds a string": [{**_ROOM, "phase_seconds": "long"}],
    "phase_seconds NaN": [{**_ROOM, "phase_seconds": math.nan}],
    "peer a list": [{**_ROOM, "peer": ["d"]}],
    "peer a string": [{**_ROOM, "peer": "decode-0"}],
    "peer pod a number": [{**_ROOM, "peer": {"pod": 3, "incarnation": "i"}}],
    "peer incarnation an object": [{**_ROOM, "peer": {"pod": "d", "incarnation": {}}}],
}


@pytest.mark.parametrize("data", list(MALFORMED.values()), ids=list(MALFORMED))
def test_malformed_rooms_are_scrape_errors(data: Any) -> None:
    with pytest.raises(ScrapeError):
        parse_rooms(data)


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=6,
)
_ROOMISH = st.fixed_dictionaries(
    {},
    optional={
        "room": _JSON | st.integers(min_value=0, max_value=2**63),
        "phase": _JSON | st.sampled_from(["bootstrap", "forward", "inflight"]),
        "phase_seconds": _JSON,
        "peer": _JSON | st.fixed_dictionaries({}, optional={"pod": _JSON, "incarnation": _JSON}),
    },
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_JSON | st.lists(_ROOMISH, max_size=4))
def test_fuzz_rooms_only_yield_rooms_or_scrape_error(data: Any) -> None:
    try:
        rooms = parse_rooms(data)
    except ScrapeError:
        return
    for r in rooms:
        assert isinstance(r.room, int) and isinstance(r.phase, str)
        assert math.isfinite(r.phase_seconds)
        assert r.peer_pod is None or isinstance(r.peer_pod, str)
        assert r.peer_incarnation is None or isinstance(r.peer_incarnation, str)
