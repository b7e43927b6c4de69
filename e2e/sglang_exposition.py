"""/metrics bodies that SGLang 0.5.23 would serve, rendered from its own metric definitions.

Why: the simulator's output and pdwarden's body cap are checked against what a real server
exposes, and a real server cannot run here. `sglang_source.definitions()` reads every metric
(name, type, label names, buckets, multiprocess mode) out of the wheel's metrics_collector.py;
this module decides which label values a server of a given shape writes and renders them the way
SGLang serves them: prometheus-client in multiprocess mode behind a `MultiProcessCollector`
(srt/utils/common.py `add_prometheus_middleware`), in a child process because prometheus-client
picks its value backend when it is first imported.

Collector labels (the `labels` every series starts with): the scheduler's are built in
`SchedulerMetricsCollector.init_new` (metrics_collector.py:1380-1396: model_name, engine_type,
tp_rank, pp_rank, moe_ep_rank, then priority="" with priority scheduling, then dp_rank with DP);
the tokenizer's in `tokenizer_metric_labels` (:1804-1820: model_name, engine_type, then
priority). Queue gauges are also written once per priority ever seen (`_log_gauge_queue_count`,
:1417-1429); tokenizer series carry each request's own priority (tokenizer_manager.py:3226-3233).
"""

from __future__ import annotations

import itertools
import json
import os
import random
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from e2e.sglang_source import MetricDef

SCHEDULER = "SchedulerMetricsCollector"
TOKENIZER = "TokenizerMetricsCollector"
# _log_gauge_queue_count's gauges (metrics_collector.py:1648-1700).
QUEUE_GAUGES = frozenset({
    "sglang:num_running_reqs", "sglang:num_queue_reqs",
    "sglang:num_prefill_bootstrap_queue_reqs", "sglang:num_prefill_inflight_queue_reqs",
    "sglang:num_decode_prealloc_queue_reqs", "sglang:num_decode_transfer_queue_reqs",
    "sglang:num_decode_host_receive_queue_reqs",
})  # fmt: skip
# Every value an extra label takes, from the code that writes it (sglang 0.5.23).
DOMAINS: Mapping[str, tuple[str, ...]] = {
    # observability/req_time_stats.py:88-215, the stages with metrics_is_observed=True that a
    # server of each disaggregation mode reaches (:776-799 and :1033-1093 pick them by mode)
    "prefill/stage": ("prefill_forward", "chunked_prefill", "prefill_bootstrap",
                      "prefill_transfer_kv_cache"),
    "decode/stage": ("decode_prepare", "decode_bootstrap", "decode_waiting",
                     "decode_transferred", "fake_output", "quick_finish"),
    # metrics_collector.py:1558-1579 (realtime), :1054-1058 (effective), :1527-1533 (cuda graph)
    "sglang:realtime_tokens_total/mode": ("prefill_compute", "prefill_cache", "decode"),
    "sglang:dp_cooperation_realtime_tokens_total/mode": (
        "prefill_compute", "prefill_cache", "decode"),
    "sglang:prefill_effective_tokens_total/mode": (
        "input", "device_hit", "host_hit", "storage_hit"),
    "sglang:cuda_graph_passes_total/mode": (
        "decode_cuda_graph", "decode_none", "prefill_cuda_graph", "prefill_none"),
    # model_executor/forward_batch_info.py:198-222, ForwardMode's members
    "category": ("EXTEND", "DECODE", "MIXED", "IDLE", "TARGET_VERIFY", "DRAFT_EXTEND_V2",
                 "PREBUILT", "SPLIT_PREFILL", "DLLM_EXTEND"),
    "forward_mode": ("EXTEND", "DECODE", "MIXED", "IDLE", "TARGET_VERIFY", "DRAFT_EXTEND_V2",
                     "PREBUILT", "SPLIT_PREFILL", "DLLM_EXTEND"),
    # observability/scheduler_stage_metrics.py:41-61
    "sglang:scheduler_stage_seconds_total/category": (
        "other", "recv_requests", "process_requests", "get_next_batch", "process_queue",
        "run_batch", "process_batch_result", "sanity_check_cache", "idle"),
    "forward_overlap": ("full", "partial", "none"),
    "kind": ("scheduled", "imbalance"),
    "rank_state": ("active", "idle"),
    "source": ("disk", "distributed", "tensor", "ipc"),  # :563-575
    "outcome": ("drained", "timeout", "error"),  # :1446
    "is_streaming": ("true", "false"),
    "cache_source": ("device", "host", "storage", "total"),  # :2118-2140
    "sglang:startup_time_seconds/phase": (
        "load_weight", "kv_cache_allocation", "scheduler_e2e", "tokenizer_e2e"),  # :2074-2084
    # managers/prefill_delayer.py:214-310
    "input_estimation": ("prefillable", "token_watermark", "unknown"),
    "output_allow": ("True", "False"),
    "output_reason": ("token_watermark", "delay", "wait_timeout", "wait_success", "no_wait"),
    "actual_execution": ("True", "False"),
}  # fmt: skip
OTHER_LABEL_VALUES = 4  # a label none of the above names (CUDA graph phases): assume 4 values
FALLBACK_BUCKETS = tuple(float(b) for b in (0, 5, 20, 50, 100, 200, 500))  # unresolvable ones


@dataclass(frozen=True)
class Shape:
    """What a pod runs: roles, parallelism and the options that add series."""

    role: str = "prefill"  # engine_type label
    tp: int = 1
    dp: int = 1  # with --enable-dp-attention: dp_rank = tp_rank // (tp // dp)
    pp: int = 1
    ep: bool = False  # moe_ep_rank follows tp_rank (expert parallel over the TP group)
    all_schedulers: bool = False  # --enable-metrics-for-all-schedulers: gauges from every rank
    priorities: tuple[int, ...] = ()  # with --enable-priority-scheduling: priorities seen
    model: str = "meta-llama/Llama-3.1-8B-Instruct"
    optional: bool = False  # LoRA, HiCache, streaming sessions, EPLB: every `if`-ed metric
    seed: int = 0

    def scheduler_labels(self) -> list[dict[str, str]]:
        out = []
        attn_tp = max(1, self.tp // max(1, self.dp))
        for pp, tp in itertools.product(range(self.pp), range(self.tp)):
            labels = {"model_name": self.model, "engine_type": self.role, "tp_rank": str(tp),
                      "pp_rank": str(pp), "moe_ep_rank": str(tp if self.ep else 0)}  # fmt: skip
            if self.priorities:
                labels["priority"] = ""
            if self.dp > 1:
                labels["dp_rank"] = str(tp // attn_tp)
            out.append(labels)
        return out

    def gauge_writers(self) -> list[dict[str, str]]:
        """Ranks whose log_stats runs: attn_tp_rank 0 of each DP rank, or every rank."""
        ranks = self.scheduler_labels()
        if self.all_schedulers:
            return ranks
        attn_tp = max(1, self.tp // max(1, self.dp))
        return [r for r in ranks if int(r["tp_rank"]) % attn_tp == 0]

    def tokenizer_labels(self) -> list[dict[str, str]]:
        base = {"model_name": self.model, "engine_type": self.role}
        if not self.priorities:
            return [base]
        return [{**base, "priority": p} for p in ("", *(str(p) for p in self.priorities))]


def _domain(d: MetricDef, label: str, role: str) -> tuple[str, ...]:
    return (
        DOMAINS.get(f"{d.name}/{label}")
        or DOMAINS.get(f"{role}/{label}")
        or DOMAINS.get(label)
        or tuple(f"{label}-{i}" for i in range(OTHER_LABEL_VALUES))
    )


def children(d: MetricDef, shape: Shape) -> list[dict[str, str]]:
    """Every label set this definition is written with on a pod of `shape`."""
    if d.owner not in (SCHEDULER, TOKENIZER) or (d.condition and not shape.optional):
        return []
    if d.name == "sglang:num_prefill_retries_total" and shape.role != "prefill":
        return []
    if d.owner == TOKENIZER:
        bases = shape.tokenizer_labels()
    else:
        bases = (
            shape.gauge_writers()
            if d.kind in ("Gauge", "GaugeHistogram")
            else (shape.scheduler_labels())
        )
        if d.name in QUEUE_GAUGES and shape.priorities:
            bases = [{**b, "priority": p} for b in bases
                     for p in ("", *(str(p) for p in shape.priorities))]  # fmt: skip
    extras = [label for label in d.extra_labels if label != "num_prefill_ranks"]
    combos: Iterable[tuple[str, ...]] = itertools.product(
        *(_domain(d, e, shape.role) for e in extras)
    )
    out = []
    for base, combo in itertools.product(bases, list(combos)):
        labels = {**base, **dict(zip(extras, combo, strict=True))}
        if "num_prefill_ranks" in d.extra_labels:
            out += [{**labels, "num_prefill_ranks": str(n)} for n in range(shape.dp + 1)]
        else:
            out.append(labels)
    return out


@dataclass
class Plan:
    """What to write, as JSON for the rendering child."""

    metrics: list[dict[str, Any]] = field(default_factory=list)

    def add(self, d: MetricDef, label_sets: Sequence[Mapping[str, str]]) -> None:
        if not label_sets:
            return
        names = list(label_sets[0])
        buckets = d.buckets if d.buckets is not None else FALLBACK_BUCKETS
        self.metrics.append({
            "kind": d.kind, "name": d.name, "doc": d.documentation or d.name,
            "labelnames": names, "buckets": list(buckets), "mode": d.multiprocess_mode,
            "children": [[ls[n] for n in names] for ls in label_sets],
        })  # fmt: skip


def plan(defs: Iterable[MetricDef], shape: Shape) -> Plan:
    out = Plan()
    for d in defs:
        out.add(d, children(d, shape))
    return out


def render(p: Plan, seed: int = 0) -> str:
    """The body a MultiProcessCollector serves for the plan (run in a child process)."""
    with tempfile.TemporaryDirectory(prefix="sglang-expo-") as directory:
        env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": directory}
        done = subprocess.run(
            [sys.executable, "-m", "e2e.sglang_exposition", str(seed)],
            input=json.dumps(p.metrics),
            capture_output=True,
            text=True,
            env=env,
            check=False,
            timeout=600,
        )
        if done.returncode != 0:
            raise RuntimeError(f"rendering failed: {done.stderr[-2000:]}")
        return done.stdout


def _child_main(seed: int) -> None:
    """Write every planned series with large, full-precision values, then collect."""
    from prometheus_client import (
        CollectorRegistry,
        Counter,
        Gauge,
        Histogram,
        Summary,
        generate_latest,
        multiprocess,
    )

    rng = random.Random(seed)

    def big() -> float:
        return rng.uniform(1e5, 1e7)

    for m in json.load(sys.stdin):
        kw: dict[str, Any] = {"labelnames": m["labelnames"]}
        kind = m["kind"]
        if kind in ("Gauge", "GaugeHistogram"):
            metric: Any = Gauge(
                m["name"],
                m["doc"],
                multiprocess_mode=m["mode"] or "mostrecent",
                labelnames=m["labelnames"] + (["gt", "le"] if kind == "GaugeHistogram" else []),
            )
        elif kind == "Counter":
            metric = Counter(m["name"], m["doc"], **kw)
        elif kind == "Histogram":
            metric = Histogram(m["name"], m["doc"], buckets=m["buckets"], **kw)
        else:
            metric = Summary(m["name"], m["doc"], **kw)
        for values in m["children"]:
            if kind == "GaugeHistogram":  # utils/gauge_histogram.py: a gauge per (gt, le]
                bounds = m["buckets"]
                edges = [*zip([0, *bounds], [*bounds, "+Inf"], strict=True)]
                for gt, le in edges:
                    metric.labels(*values, str(gt), str(le)).set(rng.randint(0, 10**4))
                continue
            child = metric.labels(*values)
            if kind == "Gauge":
                child.set(big())
            elif kind == "Counter":
                child.inc(big())
            elif kind == "Histogram":  # the bulk increment SGLang itself uses (:2170-2183)
                child._sum.inc(big())
                for bucket in child._buckets:
                    bucket.inc(rng.randint(10**5, 10**7))
            else:
                child.observe(big())
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    sys.stdout.write(generate_latest(registry).decode())


if __name__ == "__main__":
    _child_main(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
