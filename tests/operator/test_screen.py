"""scrape.screen: a Prometheus /api/v1/query answer read into what each pod's /metrics said.

The answers are built here in Prometheus's JSON shape (`answer`); a real Prometheus answering the
screen's own query is in tests/install/test_prometheus_screen.py. What matters to a user: a pod
reads the same from the screen as from its own /metrics (the text parser's Sample), a series is
never taken for another pod's, and every unusable answer is refused with a reason.
"""

from __future__ import annotations

from typing import Any

import pytest

from pdwarden.remediation.scrape.samples import parse_metrics, wanted_names
from pdwarden.remediation.scrape.screen import (
    MAX_ANSWER_SERIES,
    SCRAPED_AT,
    ScreenError,
    look_up,
    query,
    read_answer,
)
from pdwarden.values import Target
from pdworker import contract as pdw
from pdworker.metrics import WorkerMetrics

NAMES = wanted_names()
EVAL = 1_800_000_000.0
PREFILL = Target("pd-prefill-0", "u1", "prefill", "10.0.0.5", 9400, engine="pdworker")


def series(name: str, value: float, *, pod: str = "pd-prefill-0", ns: str = "ns",
           instance: str = "10.0.0.5:9400", job: str = "podMonitor/ns/pd/0",
           **labels: str) -> dict[str, Any]:  # fmt: skip
    metric = {"__name__": name, "namespace": ns, "pod": pod, "instance": instance, "job": job}
    return {"metric": {**metric, **labels}, "value": [EVAL, repr(float(value))]}


def target_series(age: float = 1.0, up: float = 1.0, **where: Any) -> list[dict[str, Any]]:
    return [series("up", up, **where), series(SCRAPED_AT, EVAL - age, **where)]


def answer(*results: dict[str, Any]) -> dict[str, Any]:
    return {"status": "success", "data": {"resultType": "vector", "result": list(results)}}


def exposition_as_prometheus(text: str, **where: Any) -> list[dict[str, Any]]:
    """Every sample line of a /metrics body as Prometheus's query would return it."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, value = line.rsplit(" ", 1)
        name, _, rest = head.partition("{")
        pairs = (p.split("=", 1) for p in rest.rstrip("}").split(",") if p)
        labels = {k: v.strip('"') for k, v in pairs}
        if name in NAMES:
            out.append(series(name, float(value), **where, **labels))
    return out


def test_a_pod_reads_the_same_from_the_screen_as_from_its_own_metrics() -> None:
    m = WorkerMetrics("prefill", "prefill-abc")
    m.completed.labels(role="prefill").inc(41)
    m.failed.labels(reason="timeout").inc(2)
    m.kv_seconds.observe(0.01)
    text = m.render().decode()
    direct = parse_metrics(text, 5.0, "pdworker")
    screen = read_answer(answer(*exposition_as_prometheus(text), *target_series()), NAMES)
    got = look_up(screen, "ns", PREFILL, max_age=10, offset=5.0 - (EVAL - 1.0))
    assert got.sample == direct  # every field, the incarnation and `at` too
    assert (got.direct, got.missing) == ("", "")


def test_another_namespace_or_pod_or_address_is_never_read_as_this_pod() -> None:
    mine = [series(pdw.PREFILL_INFLIGHT_QUEUE, 0), *target_series()]
    theirs = [
        series(pdw.PREFILL_INFLIGHT_QUEUE, 9, ns="other"),  # the same pod name, elsewhere
        *target_series(ns="other"),
        series(pdw.PREFILL_INFLIGHT_QUEUE, 9, pod="pd-prefill-1"),
    ]
    screen = read_answer(answer(*theirs, *mine), NAMES)
    got = look_up(screen, "ns", PREFILL, max_age=10, offset=0)
    assert got.sample is not None and got.sample.inflight_queue == 0
    # A reused name at a new address (a new incarnation Prometheus has not found yet): unread.
    moved = Target("pd-prefill-0", "u2", "prefill", "10.0.0.9", 9400, engine="pdworker")
    got = look_up(screen, "ns", moved, max_age=10, offset=0)
    assert got.sample is None and "not its address 10.0.0.9:9400" in got.missing


def test_a_pod_prometheus_could_not_scrape_or_two_jobs_hold_is_read_directly() -> None:
    down = read_answer(answer(series(pdw.PREFILL_INFLIGHT_QUEUE, 0), *target_series(up=0)), NAMES)
    assert "up is not 1" in look_up(down, "ns", PREFILL, max_age=10, offset=0).direct
    twice = read_answer(
        answer(series(pdw.PREFILL_INFLIGHT_QUEUE, 0), *target_series(),
               series(pdw.PREFILL_INFLIGHT_QUEUE, 0, job="other"), *target_series(job="other")),
        NAMES,
    )  # fmt: skip
    assert "2 Prometheus scrape jobs" in look_up(twice, "ns", PREFILL, max_age=10, offset=0).direct
    none = read_answer(answer(*target_series()), NAMES)  # up, yet none of the names we read
    assert "not usable" in look_up(none, "ns", PREFILL, max_age=10, offset=0).direct


def test_a_stale_or_missing_pod_is_not_judged() -> None:
    old = read_answer(answer(series(pdw.PREFILL_INFLIGHT_QUEUE, 0), *target_series(age=30)), NAMES)
    got = look_up(old, "ns", PREFILL, max_age=10, offset=0)
    assert got.sample is None and "last scraped it 30s ago (at most 10s)" in got.missing
    empty = read_answer(answer(), NAMES)
    assert "no series" in look_up(empty, "ns", PREFILL, max_age=10, offset=0).missing
    untimed = read_answer(answer(series(pdw.PREFILL_INFLIGHT_QUEUE, 0), series("up", 1)), NAMES)
    assert "no scrape time" in look_up(untimed, "ns", PREFILL, max_age=10, offset=0).missing


def test_one_scrape_of_prometheus_always_gives_the_same_sample_time() -> None:
    """Asked twice before Prometheus scrapes again, the screen repeats the pod's last scrape:
    the same `at`, so memory keeps it once (memory.remember)."""
    first = read_answer(answer(series(pdw.PREFILL_INFLIGHT_QUEUE, 1), *target_series(age=1)), NAMES)
    later = answer(series(pdw.PREFILL_INFLIGHT_QUEUE, 1), *target_series(age=1))
    for item in later["data"]["result"]:
        item["value"][0] = EVAL + 2  # evaluated 2 s later, the same scrape: 3 s old now
    second = read_answer(later, NAMES)
    a = look_up(first, "ns", PREFILL, max_age=10, offset=100.0).sample
    b = look_up(second, "ns", PREFILL, max_age=10, offset=100.0).sample
    assert a is not None and b is not None and a.at == b.at == EVAL - 1 + 100


@pytest.mark.parametrize(
    ("data", "why"),
    [
        ("not json at all", "did not answer success"),
        ({"status": "error", "error": "query timed out"}, "query timed out"),
        ({"status": "success", "data": {"resultType": "matrix", "result": []}}, "instant vector"),
        ({"status": "success", "data": {"resultType": "vector"}}, "no result list"),
        (answer("x"), "not an object"),  # type: ignore[arg-type]
        (answer({"metric": {}}), "without metric and value"),
        (answer({"metric": {"__name__": 5}, "value": [1, "1"]}), "not a string"),
        (answer({"metric": {"__name__": "up", "pod": "x" * 600}, "value": [1, "1"]}), "bounds"),
        (answer(series("up", 1) | {"value": [EVAL, "one"]}), "not a number"),
        (answer(series("up", 1) | {"value": ["NaN", "1"]}), "not finite"),
        (answer({"metric": {f"l{i}": "v" for i in range(60)}, "value": [1, "1"]}), "labels"),
    ],
)
def test_an_unusable_answer_is_refused_with_why(data: Any, why: str) -> None:
    with pytest.raises(ScreenError, match=why):
        read_answer(data, NAMES)


def test_a_huge_answer_is_refused_by_its_series_count() -> None:
    data = answer()
    data["data"]["result"] = [series("up", 1)] * (MAX_ANSWER_SERIES + 1)
    with pytest.raises(ScreenError, match=f"at most {MAX_ANSWER_SERIES}"):
        read_answer(data, NAMES)


def test_a_non_finite_queue_is_read_directly_not_trusted() -> None:
    screen = read_answer(answer(series(pdw.PREFILL_INFLIGHT_QUEUE, float("nan")),
                                *target_series()), NAMES)  # fmt: skip
    assert "not a finite number" in look_up(screen, "ns", PREFILL, max_age=10, offset=0).direct


def test_the_query_asks_for_every_name_and_only_the_operators_namespaces() -> None:
    q = query(["b_total", "a"], ["team-a", "team.b"])
    assert q.startswith('{__name__=~"a|b_total",namespace=~"team-a|team\\\\.b"}')
    assert f'"__name__", "{SCRAPED_AT}"' in q and "timestamp(up{namespace=~" in q
    assert query(["a"]).startswith('{__name__=~"a"} or label_replace(up{}, "pdwarden_screen"')
