"""The metric objects of the SIMULATED SGLang server (e2e/sglang_sim.py), as SGLang defines them.

Why apart: the simulator's behaviour (what moves when) and its exposition (names, types, HELP,
buckets, label names, multiprocess mode) are checked separately; this table is what
e2e/tests/test_sglang_sim_conformance.py compares with srt/observability/metrics_collector.py of
the real wheel. Counters are named without `_total`, which prometheus-client appends, exactly as
SGLang's own `..._total` names come out.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

_PER_STAGE = tuple(0.001 * 1.62**i for i in range(30))  # exponential_buckets(0.001, 1.62, 30)
_QUEUE_TIME = (0.0, 0.001, 0.005, 0.01, 0.05, 0.1, 0.2, 0.5, 1, 2, 3, 4, 5, 10, 15, 20, 30, 40,
               50, 60, 70, 80, 90, 100, 200, 300, 400, 500, 600, 700, 800, 900, 1000, 1200,
               1400, 1600, 1800, 2000, 2500, 3000)  # fmt: skip
# attribute -> (type, name, HELP, buckets | extra label | is_streaming), metrics_collector.py
SERIES: dict[str, tuple[str, str, str, Any]] = {
    "running": ("gauge", "sglang:num_running_reqs", "The number of running requests.", None),
    "waiting": ("gauge", "sglang:num_queue_reqs",
                "The number of requests in the waiting queue.", None),
    "throughput": ("gauge", "sglang:gen_throughput", "The generation throughput (token/s).",
                   None),
    "seq_lens": ("gauge", "sglang:decode_sum_seq_lens",
                 "The sum of all sequence lengths in decode.", None),
    "bootstrap": ("gauge", "sglang:num_prefill_bootstrap_queue_reqs",
                  "The number of requests in the prefill bootstrap queue.", None),
    "inflight": ("gauge", "sglang:num_prefill_inflight_queue_reqs",
                 "The number of requests in the prefill inflight queue.", None),
    "prealloc": ("gauge", "sglang:num_decode_prealloc_queue_reqs",
                 "The number of requests in the decode prealloc queue.", None),
    "transfer": ("gauge", "sglang:num_decode_transfer_queue_reqs",
                 "The number of requests in the decode transfer queue.", None),
    "boot_failed": ("counter", "sglang:num_bootstrap_failed_reqs",
                    "The number of bootstrap failed requests.", None),
    "xfer_failed": ("counter", "sglang:num_transfer_failed_reqs",
                    "The number of transfer failed requests.", None),
    "latency": ("histogram", "sglang:kv_transfer_latency_ms",
                "Histogram of KV cache transfer latency in ms.",
                (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000)),
    "speed": ("histogram", "sglang:kv_transfer_speed_gb_s",
              "Histogram of KV cache transfer speed in GB/s.",
              (0.1, 0.5, 1, 5, 10, 25, 50, 100, 200, 400)),
    "size": ("histogram", "sglang:kv_transfer_total_mb",
             "Histogram of KV cache transfer size in MB.",
             (1, 5, 10, 50, 100, 500, 1000, 5000, 10000)),
    "queue_time": ("histogram", "sglang:queue_time_seconds",
                   "Histogram of queueing time in seconds.", _QUEUE_TIME),
    "realtime_tokens": ("counter", "sglang:realtime_tokens",
                        "Total number of tokens processed (updated on each log interval). "
                        "mode: prefill_compute, prefill_cache, decode.", "mode"),
    "stage_latency": ("histogram", "sglang:per_stage_req_latency_seconds",
                      "The latency of each stage of requests.", _PER_STAGE),
    "prompt_tokens": ("counter", "sglang:prompt_tokens", "Number of prefill tokens processed.",
                      True),
    "gen_tokens": ("counter", "sglang:generation_tokens",
                   "Number of generation tokens processed.", True),
    "requests": ("counter", "sglang:num_requests", "Number of requests processed.", True),
    "aborted": ("counter", "sglang:num_aborted_requests", "Number of requests aborted.", False),
}  # fmt: skip
TOKENIZER_SERIES = frozenset({"prompt_tokens", "gen_tokens", "requests", "aborted"})


def make_metrics(sched_labels: list[str], tok_labels: list[str], registry: Any) -> Any:
    """One metric object per SERIES entry; `registry` None = prometheus-client's default."""
    from prometheus_client import REGISTRY, Counter, Gauge, Histogram

    out = SimpleNamespace()
    for attr, (kind, name, doc, extra) in SERIES.items():
        cls = {"gauge": Gauge, "counter": Counter, "histogram": Histogram}[kind]
        kw: dict[str, Any] = {"labelnames": sched_labels,
                              "registry": REGISTRY if registry is None else registry}  # fmt: skip
        if kind == "gauge":
            kw["multiprocess_mode"] = "mostrecent"
        elif kind == "histogram":
            kw["buckets"] = extra
        if attr == "realtime_tokens":
            kw["labelnames"] = [*sched_labels, "mode"]
        elif attr == "stage_latency":
            kw["labelnames"] = [*sched_labels, "stage"]
        if attr in TOKENIZER_SERIES:
            kw["labelnames"] = [*tok_labels, *(["is_streaming"] if extra else [])]
        setattr(out, attr, cls(name, doc, **kw))
    return out
