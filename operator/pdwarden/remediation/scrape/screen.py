"""One Prometheus answer, read into what each worker pod's /metrics said at Prometheus's last
scrape of it: the screen that prometheus mode judges the fleet by (issue 34).

Why pure and apart from the client (`scrape.prometheus`): every byte of the answer is hostile
(a Prometheus that answers garbage, hugely, or with another tenant's pods), so its reading is a
plain function with every bound in one place, tested without a server. The answer is indexed by
the target labels the Prometheus operator gives a PodMonitor's series (`namespace`, `pod`,
`instance` = pod IP:port, `job`); a pod is found only under its own namespace, name and address,
so a series that names another pod, another address (an earlier incarnation of a reused name) or
another namespace is never read as this pod's. Its values go through `samples.sample_of`, the
text parser's own last step, so a pod reads the same whoever scraped it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from pdwarden.remediation.scrape.samples import (
    MAX_LABEL_VALUE_CHARS,
    MAX_LABELS,
    MAX_SERIES,
    Found,
    ScrapeError,
    sample_of,
)
from pdwarden.values import Screened, Target

# The series the screen query adds beside the engines' own: Prometheus's `up` of each target and
# the time of its last scrape (`timestamp(up)`, renamed so the two come back in one answer).
UP: Final = "up"
SCRAPED_AT: Final = "pdwarden_scraped_at"
# Set on the two series the query adds: `or` keeps a right-hand series only if no left-hand one
# has its labels (the name aside), and a pod's `up` has exactly the labels of its unlabelled
# engine series, so without it Prometheus would drop `up` and the scrape time.
MARK: Final = "pdwarden_screen"
# Labels Prometheus gives a target: they say whose a series is, never what it measures.
TARGET_LABELS: Final = frozenset({"__name__", "namespace", "pod", "instance", "job", MARK})
MAX_ANSWER_SERIES: Final = 1_000_000  # of one answer: 5000 pods x 200 series
MAX_PODS: Final = 100_000


class ScreenError(ValueError):
    """Prometheus's answer cannot be used at all (the message says why)."""


@dataclass
class JobSeries:
    """What one scrape job of Prometheus holds of one pod."""

    instance: str
    up: float | None = None
    scraped_at: float | None = None  # Prometheus's clock, seconds
    found: Found = field(default_factory=dict)
    series: int = 0


@dataclass(frozen=True)
class PodScreen:
    """One pod as the screen saw it: the job that scraped it and what it held."""

    instance: str
    up: float | None
    age: float | None  # seconds between Prometheus's last scrape of it and the query
    found: Found
    jobs: int  # scrape jobs that hold series of it (more than one: its values are ambiguous)


@dataclass(frozen=True)
class Screen:
    """One answer: the query's evaluation time and every pod it named, by (namespace, pod)."""

    evaluated_at: float  # Prometheus's clock
    pods: Mapping[tuple[str, str], PodScreen]
    series: int


def query(names: Iterable[str], namespaces: Iterable[str] = ()) -> str:
    """The one PromQL query of a screen: every wanted series, `up`, and when each target was
    last scraped; limited to the operator's namespaces when it has a list of them."""
    scope = "|".join(sorted(_promql_regex(n) for n in namespaces))
    only = f',namespace=~"{scope}"' if scope else ""
    wanted = "|".join(sorted(_promql_regex(n) for n in names))
    up = f"{UP}{{{only.lstrip(',')}}}"
    scraped = f'label_replace(timestamp({up}), "__name__", "{SCRAPED_AT}", "", "")'
    return (
        f'{{__name__=~"{wanted}"{only}}}'
        f' or label_replace({up}, "{MARK}", "{UP}", "", "")'
        f' or label_replace({scraped}, "{MARK}", "{SCRAPED_AT}", "", "")'
    )


def _promql_regex(literal: str) -> str:
    """A label value or metric name as a literal inside a PromQL double-quoted RE2 pattern."""
    out = []
    for c in literal:
        if c in r".^$*+?()[]{}|\\":
            out.append("\\\\" + c)
        elif c in '"':
            out.append('\\"')
        else:
            out.append(c)
    return "".join(out)


def read_answer(data: Any, names: frozenset[str]) -> Screen:
    """Index a /api/v1/query answer (decoded JSON) by pod; raise ScreenError for anything that
    is not a successful instant-vector answer within bounds. Series of names nobody reads,
    without a namespace and pod, or with a value that is not a number are skipped."""
    if not isinstance(data, dict) or data.get("status") != "success":
        why = data.get("error") if isinstance(data, dict) else None
        raise ScreenError(f"Prometheus did not answer success: {str(why)[:200] or 'no status'}")
    body = data.get("data")
    if not isinstance(body, dict) or body.get("resultType") != "vector":
        raise ScreenError("Prometheus's answer is not an instant vector")
    result = body.get("result")
    if not isinstance(result, list):
        raise ScreenError("Prometheus's answer has no result list")
    if len(result) > MAX_ANSWER_SERIES:
        raise ScreenError(f"Prometheus answered {len(result)} series (at most {MAX_ANSWER_SERIES})")
    evaluated: float | None = None
    by_pod: dict[tuple[str, str], dict[str, JobSeries]] = {}
    for item in result:
        parsed = _item(item)
        if parsed is None:
            continue
        labels, at, value = parsed
        evaluated = at if evaluated is None else max(evaluated, at)
        name, ns, pod = labels["__name__"], labels["namespace"], labels["pod"]
        if name not in names and name not in (UP, SCRAPED_AT):
            continue
        jobs = by_pod.get((ns, pod))
        if jobs is None:
            if len(by_pod) >= MAX_PODS:
                raise ScreenError(f"Prometheus's answer names more than {MAX_PODS} pods")
            jobs = by_pod[(ns, pod)] = {}
        job = jobs.setdefault(labels.get("job", ""), JobSeries(labels.get("instance", "")))
        if labels.get("instance", "") != job.instance:
            job.instance = "?"  # one job, two addresses for one pod: which one is it?
        if name == UP:
            job.up = value
        elif name == SCRAPED_AT:
            job.scraped_at = value
        else:
            job.series += 1
            if job.series > MAX_SERIES:
                raise ScreenError(f"more than {MAX_SERIES} series of pod {ns}/{pod}")
            kept = {k: v for k, v in labels.items() if k not in TARGET_LABELS}
            job.found.setdefault(name, []).append((kept, value))
    pods = {key: _pod(jobs, evaluated or 0.0) for key, jobs in by_pod.items()}
    return Screen(evaluated or 0.0, pods, len(result))


def _item(item: Any) -> tuple[dict[str, str], float, float] | None:
    """(labels, evaluation time, value) of one result item, or None to skip it."""
    if not isinstance(item, dict):
        raise ScreenError("Prometheus's answer holds a result that is not an object")
    metric, pair = item.get("metric"), item.get("value")
    if not isinstance(metric, dict) or not isinstance(pair, list) or len(pair) != 2:
        raise ScreenError("Prometheus's answer holds a result without metric and value")
    if len(metric) > MAX_LABELS + len(TARGET_LABELS) + 8:
        raise ScreenError(f"a series with {len(metric)} labels")
    labels: dict[str, str] = {}
    for k, v in metric.items():
        if not isinstance(v, str) or len(v) > MAX_LABEL_VALUE_CHARS or len(k) > 128:
            raise ScreenError("a label that is not a string within bounds")
        labels[k] = v
    if not labels.get("__name__") or not labels.get("namespace") or not labels.get("pod"):
        return None
    try:
        at, value = float(pair[0]), float(pair[1])
    except (TypeError, ValueError):
        raise ScreenError("a value that is not a number") from None
    if not math.isfinite(at):
        raise ScreenError("a sample time that is not finite")
    return labels, at, value


def _pod(jobs: Mapping[str, JobSeries], evaluated: float) -> PodScreen:
    held = [j for j in jobs.values() if j.found]
    job = held[0] if len(held) == 1 else next(iter(jobs.values()))
    age = None if job.scraped_at is None else max(0.0, evaluated - job.scraped_at)
    return PodScreen(job.instance, job.up, age, job.found if len(held) == 1 else {}, len(held))


def look_up(
    screen: Screen, namespace: str, target: Target, *, max_age: float, offset: float
) -> Screened:
    """`target` in `screen`. `offset` maps Prometheus's clock onto the monotonic clock samples
    are stamped with (one scrape of Prometheus's always gives the same `at`); `max_age` is how
    old its last scrape of the pod may be."""
    seen = screen.pods.get((namespace, target.pod))
    address = f"{target.ip}:{target.port}"
    if seen is None:
        return Screened(missing="Prometheus holds no series of it")
    if seen.jobs > 1:
        return Screened(direct=f"{seen.jobs} Prometheus scrape jobs hold its series")
    if seen.instance != address:
        return Screened(missing=f"Prometheus's series of it come from {seen.instance[:64]}, "
                              f"not its address {address}")  # fmt: skip
    if seen.up != 1:
        return Screened(direct="Prometheus could not scrape it (up is not 1)")
    if seen.age is None:
        return Screened(missing="Prometheus holds no scrape time of it")
    if seen.age > max_age:
        return Screened(missing=f"Prometheus last scraped it {seen.age:.0f}s ago "
                              f"(at most {max_age:.0f}s)")  # fmt: skip
    at = screen.evaluated_at - seen.age + offset
    try:
        return Screened(sample_of(seen.found, at, target.engine))
    except ScrapeError as e:
        return Screened(direct=f"its series in Prometheus are not usable: {e}")
