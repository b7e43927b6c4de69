"""What each engine's /metrics series mean: one table per engine, read by the parser.

Why data: detection must judge pdworker and stock SGLang by the same rules, and SGLang's names
are easy to misread (issue 12). Each `Series` says which Sample field a series feeds, which
label values it must carry, and how its copies combine. Everything here is checked against
sglang 0.5.23 (`srt/observability/metrics_collector.py`, `srt/managers/scheduler_components/
metrics_reporter.py`, `srt/observability/req_time_stats.py`, `srt/disaggregation/prefill.py`,
`srt/managers/tokenizer_manager.py`); the pdworker names come from its contract module.

How SGLang copies combine (`RANK_COPIES`):

* Scheduler series carry `model_name, engine_type, tp_rank, pp_rank, moe_ep_rank`, plus
  `dp_rank` with data parallelism and `priority` with priority scheduling. Each DP rank is its
  own scheduler with its own requests: those are *summed*.
* Within one DP rank, every TP/PP/EP rank that exports (counters and histograms are written by
  every rank whenever metrics are on; gauges by `attn_tp_rank == 0`, or by every rank with
  `--enable-metrics-for-all-schedulers`) reports the *same* scheduler state: TP ranks poll the
  KV senders with an all-reduce, PP ranks reach consensus on finished rids. Summing them would
  multiply the queue by the number of ranks, so we take the *max* of the copies: it never
  under-counts queued work, and a max of counters stays monotone.
* Queue gauges are written twice under priority scheduling: the total under `priority=""` and
  one series per priority. Scheduler series are read at `priority=""` only (absent = "").
  Tokenizer counters instead label each request with its own priority: those are summed.

Progress signals (`Sample.generated_tokens` is only ever fed by a counter that moves on every
decode step): `sglang:realtime_tokens_total{mode="decode"}` is incremented in
`report_decode_stats` on every decode iteration; `sglang:gen_throughput` is refreshed every
`decode_log_interval` steps and decays to 0 after 30 s without decode stats. NOT used:
`sglang:generation_tokens_total`, which `observe_one_finished_request` moves only when a request
finishes, so a decode streaming four long answers shows it flat for minutes. Finish-only counters
(`num_requests_total`) feed `completed`: their movement proves progress, their flatness proves
nothing. Drain of the prefill inflight queue: `per_stage_req_latency_seconds{stage=
"prefill_transfer_kv_cache"}` is observed for every room whose transfer succeeded
(`set_prefill_kv_transfer_finish_time`), and the failure counters for every room that failed;
on decode, `stage="decode_transferred"` for every room whose KV arrived.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final, Literal

from pdworker import contract as pdw

EngineName = Literal["pdworker", "sglang"]
RANK_COPIES: Final = ("tp_rank", "pp_rank", "moe_ep_rank")


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

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(k, "") == v for k, v in self.select.items())


@dataclass(frozen=True)
class Engine:
    name: str
    series: tuple[Series, ...]

    def names(self) -> frozenset[str]:
        """Every sample name the parser must keep: the cheap line filter's allow-list."""
        return frozenset(s.name for s in self.series)

    def by_name(self) -> Mapping[str, tuple[Series, ...]]:
        out: dict[str, list[Series]] = {}
        for s in self.series:
            out.setdefault(s.name, []).append(s)
        return {k: tuple(v) for k, v in out.items()}


def combine(series: Series, samples: Iterable[tuple[Mapping[str, str], float]]) -> float | None:
    """The value of one Series over the samples of its name; None if none matched."""
    groups: dict[tuple[str, ...], float] = {}
    for labels, value in samples:
        if not series.matches(labels):
            continue
        key = tuple(labels.get(k, "") for k in series.sum_over)
        groups[key] = max(groups.get(key, value), value)
    return sum(groups.values()) if groups else None


PDWORKER: Final = Engine(
    "pdworker",
    (
        Series(pdw.PREFILL_BOOTSTRAP_QUEUE, "bootstrap_queue"),
        Series(pdw.PREFILL_INFLIGHT_QUEUE, "inflight_queue"),
        Series(pdw.PREFILL_INFLIGHT_OLDEST, "inflight_oldest_seconds"),
        Series(pdw.DECODE_PREALLOC_QUEUE, "prealloc_queue"),
        Series(pdw.DECODE_TRANSFER_QUEUE, "transfer_queue"),
        Series(pdw.DECODE_RUNNING, "running"),
        # pdworker's token counter moves on every generated token: a valid progress signal.
        Series(pdw.GENERATED_TOKENS, "generated_tokens"),
        Series(pdw.REQUESTS_COMPLETED, "completed", sum_over=("role",)),
        Series(pdw.REQUESTS_FAILED, "failed", sum_over=("reason",)),
        # Observed per room when its KV transfer finished: sent on prefill, received on decode.
        Series(pdw.KV_TRANSFER_SECONDS + "_count", "kv_transfers"),
    ),
)


def _sched(name: str, target: str, **select: str) -> Series:
    """A scheduler series: DP ranks summed, TP/PP/EP copies maxed, the priority="" total."""
    return Series(name, target, select={"priority": "", **select}, sum_over=("dp_rank",))


_STAGES: Final = "sglang:per_stage_req_latency_seconds_count"
SGLANG: Final = Engine(
    "sglang",
    (
        _sched("sglang:num_prefill_bootstrap_queue_reqs", "bootstrap_queue"),
        # The name of the same queue in builds before observability/metrics_collector.py.
        _sched("sglang:num_prefill_prealloc_queue_reqs", "bootstrap_queue"),
        _sched("sglang:num_prefill_inflight_queue_reqs", "inflight_queue"),
        _sched("sglang:num_decode_prealloc_queue_reqs", "prealloc_queue"),
        _sched("sglang:num_decode_transfer_queue_reqs", "transfer_queue"),
        _sched("sglang:num_running_reqs", "running"),
        _sched("sglang:num_queue_reqs", "waiting_queue"),
        _sched("sglang:gen_throughput", "throughput"),
        _sched("sglang:realtime_tokens_total", "generated_tokens", mode="decode"),
        _sched("sglang:realtime_tokens_total", "prefill_tokens", mode="prefill_compute"),
        _sched(_STAGES, "kv_transfers", stage="prefill_transfer_kv_cache"),
        _sched(_STAGES, "kv_transfers", stage="decode_transferred"),
        _sched("sglang:num_bootstrap_failed_reqs_total", "failed"),
        _sched("sglang:num_transfer_failed_reqs_total", "failed"),
        # Tokenizer counter (finish-only on decode; on prefill a request finishes when its KV
        # transfer ends). Its labels partition requests: sum them all.
        Series("sglang:num_requests_total", "completed", sum_over=("is_streaming", "priority")),
    ),
)

ENGINES: Final[Mapping[str, Engine]] = {"pdworker": PDWORKER, "sglang": SGLANG}
# Both tables at once, for callers that do not know the engine (each body has one's names).
ANY: Final = Engine("any", PDWORKER.series + SGLANG.series)
# Sample fields that count monotonically (counters): any change between samples is movement.
COUNTER_FIELDS: Final = (
    "generated_tokens", "prefill_tokens", "kv_transfers", "completed", "failed",
)  # fmt: skip


def engine(name: str | None) -> Engine:
    if name is None:
        return ANY
    try:
        return ENGINES[name]
    except KeyError:
        raise ValueError(f"unknown engine {name!r}; known: {sorted(ENGINES)}") from None
