"""The one protocol every engine implements, and the metric-table types its module fills in.

Why a module of its own: the renderer, the scrape parser, detection, the plan, the confirm stage
and the configuration advisor all ask an engine the same questions (how its pods run, what its
/metrics series mean, which repair ladder it supports, whether a decode must be confirmed by a
canary, which of a pod's settings switch its own safety nets off). Writing those
questions down once, as `Engine`, is what lets a new engine be one module plus one registration
line (`engines/__init__.py`) and lets one contract test suite run over every engine.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType
from typing import Any, Final, Literal, Protocol

from pdwarden.api import PDDeploymentSpec
from pdwarden.engines.launch import Launch
from pdwarden.values import PairCanary

Obj = Mapping[str, Any]

# The prefill-side rungs of the plan's ladder (remediation/decide/rungs.py holds one function for
# each); an engine maps the findings it can repair to one of them (`Engine.prefill_rungs`).
PrefillRung = Literal[
    "fail_rooms", "abort_requests", "restart_read_peer", "restart_prefill",
    "restart_failing_prefill",
]  # fmt: skip

# Sample fields that count monotonically (counters): any change between samples is movement.
COUNTER_FIELDS: Final = (
    "generated_tokens", "prefill_tokens", "kv_transfers", "completed", "failed",
    "kv_expired", "late_notifications", "recomputed_tokens", "transferred_tokens",
)  # fmt: skip


@dataclass(frozen=True)
class Series:
    """One exposed sample name (counters with `_total`, histograms with `_count`) -> a field."""

    name: str
    target: str  # the Sample field it feeds
    # Label values a series must carry to count; a label that is absent reads as "".
    select: Mapping[str, str] = field(default_factory=dict)
    # Labels whose values partition the work: series that differ in them are summed. Series
    # that differ only in other labels are copies of the same number: the max is kept.
    sum_over: tuple[str, ...] = ()
    # Every distinct label set is its own share of the work (no copies at all): all are summed.
    partitioned: bool = False

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(k, "") == v for k, v in self.select.items())


@dataclass(frozen=True)
class MetricTable:
    """What one engine's /metrics series mean: the parser keeps and combines exactly these."""

    name: str
    series: tuple[Series, ...]

    def names(self) -> frozenset[str]:
        """Every sample name the parser must keep: the cheap line filter's allow-list."""
        return self._names

    def by_name(self) -> Mapping[str, tuple[Series, ...]]:
        return self._by_name

    # Computed once per table (every scrape of every pod asks): the table is frozen.
    @cached_property
    def _names(self) -> frozenset[str]:
        return frozenset(s.name for s in self.series)

    @cached_property
    def _by_name(self) -> Mapping[str, tuple[Series, ...]]:
        out: dict[str, list[Series]] = {}
        for s in self.series:
            out.setdefault(s.name, []).append(s)
        return MappingProxyType({k: tuple(v) for k, v in out.items()})


def combine(series: Series, samples: Iterable[tuple[Mapping[str, str], float]]) -> float | None:
    """The value of one Series over the samples of its name; None if none matched."""
    groups: dict[tuple[object, ...], float] = {}
    for labels, value in samples:
        if not series.matches(labels):
            continue
        key = (
            tuple(sorted(labels.items()))
            if series.partitioned
            else tuple(labels.get(k, "") for k in series.sum_over)
        )
        groups[key] = max(groups.get(key, value), value)
    return sum(groups.values()) if groups else None


@dataclass(frozen=True)
class AdviceRule:
    """A setting that switches one of an engine's own safety nets off, or lets a request be
    served from the wrong KV without an error: pdwarden warns of it (the Advisories condition,
    one Event per pod), never blocks or acts on it."""

    name: str  # CamelCase, unique over all engines: with the pod, the identity of its Event
    setting: str  # the flag or environment variable, as a user searches for it
    source: str  # the engine's source file:line that shows the effect (its own release)
    risk: str  # what can happen, in one sentence

    def advise(self, value: object) -> Advice:
        return Advice(self, str(value))


@dataclass(frozen=True)
class Advice:
    """One rule that fires on one pod, with the value the pod sets, as read."""

    rule: AdviceRule
    value: str


# A series a health-check or canary request moves, with the label values that select it: such a
# series is never read as progress (tests/engines/ holds every table clear of them).
ProbeMoved = tuple[str, Mapping[str, str]]


class Engine(Protocol):
    """Everything the pipelines ask of one engine. One implementation per module in engines/."""

    @property
    def name(self) -> str:
        """The value of spec.engine (api/spec.py `Engine` lists the same names; a test holds
        them together)."""
        ...

    # -- render: how its pods and its router run --------------------------------------------
    def worker_launch(self, spec: PDDeploymentSpec, role: str, deployment: str) -> Launch:
        """The prefill or decode container: command, env, probes, volumes."""
        ...

    def router_launch(self, spec: PDDeploymentSpec, deployment: str, namespace: str) -> Launch:
        """The router container, which finds the deployment's pods by their labels."""
        ...

    def needs_admin_token(self, spec: PDDeploymentSpec, role: str) -> bool:
        """Whether a pod of `role` gets the admin token Secret mounted."""
        ...

    @property
    def always_routed(self) -> bool:
        """A router is rendered even with spec.router.replicas 0 (the engine needs one)."""
        ...

    @property
    def bootstrap_key(self) -> bool:
        """Prefill and decode share the per-deployment KV-handshake key Secret."""
        ...

    @property
    def decode_lists_prefills(self) -> bool:
        """A decode lists its deployment's prefill pods itself (the router's ServiceAccount)."""
        ...

    # -- observe: what its /metrics series mean ---------------------------------------------
    @property
    def metrics(self) -> MetricTable: ...

    @property
    def probe_moved(self) -> tuple[ProbeMoved, ...]:
        """Series a probe or canary request moves: never read as progress."""
        ...

    @property
    def rooms_api(self) -> bool:
        """Its prefill lists its rooms and fails them by id (pdworker's admin API)."""
        ...

    def rooms_wait_for_decode_kv(self, pod: Obj, role: str) -> bool:
        """Whether rooms may legitimately wait in this prefill's inflight queue for a decode to
        allocate KV, read from the pod's own launch flags (True: the excuse stays)."""
        ...

    def bootstrap_port(self, pod: Obj, role: str) -> int:
        """The port a decode asks this prefill's KV bootstrap server on, read from the pod's own
        launch flags, where the pair canary's KV request must name it (SGLang); 0: none."""
        ...

    # -- decide and confirm: its repair ladder --------------------------------------------
    @property
    def prefill_rungs(self) -> Mapping[str, PrefillRung]:
        """Finding reason -> the prefill-side rung that repairs it (the ladder as data; the
        decode rungs, cordon -> restart -> uncordon, are the same for every engine)."""
        ...

    @property
    def pair_canary(self) -> PairCanary | None:
        """How to send a canary through a prefill and a decode (None: the engine has none)."""
        ...

    @property
    def canary_confirms_decodes(self) -> bool:
        """A suspect decode is asked for one token before it is cordoned (remediation/confirm),
        because nothing on its own metrics shows its engine froze."""
        ...

    # -- advise: settings that switch its own safety nets off ---------------------------------
    @property
    def advisory_rules(self) -> tuple[AdviceRule, ...]:
        """Every rule `advisories` can fire (docs/engines.md lists them)."""
        ...

    def advisories(self, pod: Obj) -> tuple[Advice, ...]:
        """The rules that fire on this pod, read from its own command line and environment;
        () when they cannot be read (a pod is never flagged for what it does not show)."""
        ...
