"""Regenerate the SGLang /metrics fixtures the way SGLang itself produces them.

SGLang (0.5.23) runs prometheus-client in multiprocess mode: every scheduler process (one per
TP/PP/DP rank) and the tokenizer manager write their own files under PROMETHEUS_MULTIPROC_DIR,
and the HTTP server answers /metrics with a `MultiProcessCollector` over that directory
(`srt/utils/common.py: add_prometheus_middleware`). This script does exactly that with real
processes: metric names, types, HELP text, label names and their order, buckets and
`multiprocess_mode` are those of `srt/observability/metrics_collector.py` (scheduler labels from
`SchedulerMetricsCollector.init_new`, queue gauges written as in `_log_gauge_queue_count`,
tokenizer labels from `tokenizer_metric_labels`). Only the numbers are made up; tests assert
them. Which ranks write what follows the source: gauges come from `log_stats`, which only
`attn_tp_rank == 0` runs (or every rank with `--enable-metrics-for-all-schedulers`); counters
and histograms incremented under `metrics_reporter.enable_metrics` come from every rank.

Run from the repository root: `.venv/bin/python tests/remediation/data/make_sglang_fixtures.py`
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
SOURCE = "sglang 0.5.23, python/sglang/srt/observability/metrics_collector.py"

# (name, help, multiprocess_mode) of the scheduler gauges in these fixtures.
GAUGES = {
    "sglang:num_running_reqs": "The number of running requests.",
    "sglang:num_queue_reqs": "The number of requests in the waiting queue.",
    "sglang:gen_throughput": "The generation throughput (token/s).",
    "sglang:token_usage": "The token usage.",
    "sglang:num_used_tokens": "The number of used tokens.",
    "sglang:num_prefill_bootstrap_queue_reqs": (
        "The number of requests in the prefill bootstrap queue."
    ),
    "sglang:num_prefill_inflight_queue_reqs": (
        "The number of requests in the prefill inflight queue."
    ),
    "sglang:num_decode_prealloc_queue_reqs": "The number of requests in the decode prealloc queue.",
    "sglang:num_decode_transfer_queue_reqs": "The number of requests in the decode transfer queue.",
}
QUEUE_GAUGES = {  # written by _log_gauge_queue_count: a total and, with priorities, a breakdown
    "sglang:num_running_reqs",
    "sglang:num_queue_reqs",
    "sglang:num_prefill_bootstrap_queue_reqs",
    "sglang:num_prefill_inflight_queue_reqs",
    "sglang:num_decode_prealloc_queue_reqs",
    "sglang:num_decode_transfer_queue_reqs",
}
COUNTERS = {  # name without _total (prometheus-client appends it), help, extra label names
    "sglang:num_bootstrap_failed_reqs": ("The number of bootstrap failed requests.", ()),
    "sglang:num_transfer_failed_reqs": ("The number of transfer failed requests.", ()),
    "sglang:realtime_tokens": (
        "Total number of tokens processed (updated on each log interval). "
        "mode: prefill_compute, prefill_cache, decode.",
        ("mode",),
    ),
}
# exponential_buckets(start=0.001, width=1.62, length=30), as in the source
PER_STAGE_BUCKETS = [0.001 * 1.62**i for i in range(30)]
KV_LATENCY_BUCKETS = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000)
TTFT_BUCKETS = [0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400]


def scheduler(directory: str, labels: dict[str, str], state: dict[str, Any]) -> None:
    """One SGLang scheduler process: its collector, its values, its multiprocess files."""
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = directory
    from prometheus_client import Counter, Gauge, Histogram

    gauges = {
        n: Gauge(name=n, documentation=h, labelnames=labels.keys(), multiprocess_mode="mostrecent")
        for n, h in GAUGES.items()
    }
    counters = {
        n: Counter(name=n, documentation=h, labelnames=[*labels.keys(), *extra])
        for n, (h, extra) in COUNTERS.items()
    }
    per_stage = Histogram(
        name="sglang:per_stage_req_latency_seconds",
        documentation="The latency of each stage of requests.",
        buckets=PER_STAGE_BUCKETS,
        labelnames=[*labels.keys(), "stage"],
    )
    kv_latency = Histogram(
        name="sglang:kv_transfer_latency_ms",
        documentation="Histogram of KV cache transfer latency in ms.",
        labelnames=labels.keys(),
        buckets=KV_LATENCY_BUCKETS,
    )
    for name, value in state.get("gauges", {}).items():
        total, by_priority = value if isinstance(value, tuple) else (value, None)
        gauges[name].labels(**labels).set(total)
        if name in QUEUE_GAUGES and by_priority is not None and "priority" in labels:
            for priority, n in by_priority.items():
                gauges[name].labels(**{**labels, "priority": str(priority)}).set(n)
    for name, incs in state.get("counters", {}).items():
        for extra, amount in incs:
            counters[name].labels(**labels, **extra).inc(amount)
    for stage, observations in state.get("stages", {}).items():
        for x in observations:
            per_stage.labels(**labels, stage=stage).observe(x)
    for x in state.get("kv_latency_ms", []):
        kv_latency.labels(**labels).observe(x)


def tokenizer(directory: str, labels: dict[str, str], finished: list[dict[str, Any]]) -> None:
    """The tokenizer manager: observe_one_finished_request per finished request."""
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = directory
    from prometheus_client import Counter, Histogram

    stream = [*labels.keys(), "is_streaming"]
    prompt = Counter(
        name="sglang:prompt_tokens", documentation="Number of prefill tokens processed.",
        labelnames=stream,
    )  # fmt: skip
    generation = Counter(
        name="sglang:generation_tokens", documentation="Number of generation tokens processed.",
        labelnames=stream,
    )  # fmt: skip
    requests = Counter(
        name="sglang:num_requests", documentation="Number of requests processed.", labelnames=stream
    )
    ttft = Histogram(
        name="sglang:time_to_first_token_seconds",
        documentation="Histogram of time to first token in seconds.",
        labelnames=stream,
        buckets=TTFT_BUCKETS,
    )
    for r in finished:
        request_labels = {**labels, "is_streaming": "true" if r["stream"] else "false"}
        if "priority" in labels:
            request_labels["priority"] = str(r["priority"])
        prompt.labels(**request_labels).inc(r["prompt"])
        generation.labels(**request_labels).inc(r["generated"])
        requests.labels(**request_labels).inc(1)
        if r.get("ttft") is not None:
            ttft.labels(**request_labels).observe(r["ttft"])


def sched_labels(
    engine_type: str, tp: int, pp: int = 0, dp: int | None = None, priority: bool = False
) -> dict[str, str]:
    """SchedulerMetricsCollector.init_new's labels, in its order."""
    labels = {
        "model_name": MODEL, "engine_type": engine_type,
        "tp_rank": str(tp), "pp_rank": str(pp), "moe_ep_rank": "0",
    }  # fmt: skip
    if priority:
        labels["priority"] = ""
    if dp is not None:
        labels["dp_rank"] = str(dp)
    return labels


def render(processes: list[tuple[Any, tuple[Any, ...]]]) -> str:
    """Run each (function, args) in its own process, then collect like SGLang's /metrics."""
    ctx = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory() as directory:
        for func, args in processes:
            p = ctx.Process(target=func, args=(directory, *args))
            p.start()
            p.join()
            if p.exitcode != 0:
                raise SystemExit(f"{func.__name__}{args[:1]} failed with {p.exitcode}")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = directory
        from prometheus_client import CollectorRegistry, generate_latest, multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return generate_latest(registry).decode()


def requests(n: int, stream_every: int = 2, priorities: tuple[int, ...] = (0, 1)) -> list[dict]:
    return [
        {"stream": i % stream_every == 0, "priority": priorities[i % len(priorities)],
         "prompt": 1000 + i, "generated": 1 if i % 3 else 200, "ttft": 0.05 * (i % 9 + 1)}
        for i in range(n)
    ]  # fmt: skip


def prefill_dp2_priority() -> str:
    """Prefill, --tp 4 --dp 2 --enable-dp-attention (attn_tp_size 2), priority scheduling.

    DP rank d runs TP ranks 2d and 2d+1; gauges come from the attn_tp_rank 0 of each (tp 0, 2),
    counters and histograms from all four. Inflight: 3 on dp 0 (priorities 0:2, 1:1), 1 on dp 1.
    """
    procs: list[tuple[Any, tuple[Any, ...]]] = []
    per_dp = {
        0: {"inflight": (3, {0: 2, 1: 1}), "bootstrap": (2, {0: 1, 1: 1}), "queue": (1, {1: 1}),
            "sent": 40, "boot_failed": 1, "xfer_failed": 0, "prefill_tokens": 100_000},
        1: {"inflight": (1, {0: 1, 1: 0}), "bootstrap": (0, {0: 0, 1: 0}), "queue": (0, {1: 0}),
            "sent": 37, "boot_failed": 0, "xfer_failed": 2, "prefill_tokens": 90_000},
    }  # fmt: skip
    for dp, v in per_dp.items():
        for tp in (2 * dp, 2 * dp + 1):
            state: dict[str, Any] = {
                "counters": {
                    "sglang:num_bootstrap_failed_reqs": [({}, v["boot_failed"])],
                    "sglang:num_transfer_failed_reqs": [({}, v["xfer_failed"])],
                },
                "stages": {
                    "prefill_bootstrap": [0.02] * (v["sent"] + 3),
                    "prefill_forward": [0.3] * (v["sent"] + 2),
                    "prefill_transfer_kv_cache": [0.05] * v["sent"],
                },
                "kv_latency_ms": [50.0] * v["sent"],
            }
            if tp % 2 == 0:  # attn_tp_rank 0: log_stats and realtime tokens
                state["gauges"] = {
                    "sglang:num_running_reqs": (0, {0: 0, 1: 0}),
                    "sglang:num_queue_reqs": v["queue"],
                    "sglang:gen_throughput": 0.0,
                    "sglang:token_usage": 0.04,
                    "sglang:num_used_tokens": 12288,
                    "sglang:num_prefill_bootstrap_queue_reqs": v["bootstrap"],
                    "sglang:num_prefill_inflight_queue_reqs": v["inflight"],
                }
                state["counters"]["sglang:realtime_tokens"] = [
                    ({"mode": "prefill_compute"}, v["prefill_tokens"]),
                    ({"mode": "prefill_cache"}, 4096),
                ]
            labels = sched_labels("prefill", tp=tp, dp=dp, priority=True)
            procs.append((scheduler, (labels, state)))
    tok = {"model_name": MODEL, "engine_type": "prefill", "priority": ""}
    procs.append((tokenizer, (tok, [{**r, "ttft": None} for r in requests(77)])))
    return render(procs)


def decode_dp2_priority() -> str:
    """Decode, --tp 2 --dp 2 --enable-dp-attention (attn_tp_size 1), priority scheduling."""
    procs: list[tuple[Any, tuple[Any, ...]]] = []
    per_dp = {
        0: {"running": (14, {0: 10, 1: 4}), "prealloc": (1, {0: 1, 1: 0}),
            "transfer": (3, {0: 2, 1: 1}), "tput": 500.0, "tokens": 600_000, "arrived": 80},
        1: {"running": (10, {0: 5, 1: 5}), "prealloc": (0, {0: 0, 1: 0}),
            "transfer": (1, {0: 0, 1: 1}), "tput": 312.5, "tokens": 400_000, "arrived": 70},
    }  # fmt: skip
    for dp, v in per_dp.items():
        state = {
            "gauges": {
                "sglang:num_running_reqs": v["running"],
                "sglang:num_queue_reqs": (0, {0: 0, 1: 0}),
                "sglang:gen_throughput": v["tput"],
                "sglang:token_usage": 0.61,
                "sglang:num_used_tokens": 180_000,
                "sglang:num_decode_prealloc_queue_reqs": v["prealloc"],
                "sglang:num_decode_transfer_queue_reqs": v["transfer"],
            },
            "counters": {
                "sglang:realtime_tokens": [({"mode": "decode"}, v["tokens"])],
                "sglang:num_transfer_failed_reqs": [({}, 1 - dp)],
            },
            "stages": {
                "decode_prepare": [0.001] * (v["arrived"] + 5),
                "decode_bootstrap": [0.01] * (v["arrived"] + 4),
                "decode_transferred": [0.08] * v["arrived"],
            },
        }
        procs.append((scheduler, (sched_labels("decode", tp=dp, dp=dp, priority=True), state)))
    tok = {"model_name": MODEL, "engine_type": "decode", "priority": ""}
    procs.append((tokenizer, (tok, requests(120))))
    return render(procs)


def prefill_pp2_all_schedulers() -> str:
    """Prefill, --tp 2 --pp 2 --enable-metrics-for-all-schedulers, no DP, no priorities:
    four schedulers (tp x pp) each write the same queue state; it must read as one."""
    procs: list[tuple[Any, tuple[Any, ...]]] = []
    for pp in (0, 1):
        for tp in (0, 1):
            state = {
                "gauges": {
                    "sglang:num_running_reqs": 1,
                    "sglang:num_queue_reqs": 2,
                    "sglang:gen_throughput": 0.0,
                    "sglang:num_prefill_bootstrap_queue_reqs": 1,
                    "sglang:num_prefill_inflight_queue_reqs": 5,
                },
                "counters": {
                    "sglang:realtime_tokens": [({"mode": "prefill_compute"}, 50_000)],
                    "sglang:num_transfer_failed_reqs": [({}, 1)],
                },
                "stages": {"prefill_transfer_kv_cache": [0.04] * 12},
                "kv_latency_ms": [40.0] * 12,
            }
            procs.append((scheduler, (sched_labels("prefill", tp=tp, pp=pp), state)))
    tok = {"model_name": MODEL, "engine_type": "prefill"}
    procs.append((tokenizer, (tok, [{**r, "ttft": None} for r in requests(13, priorities=(0,))])))
    return render(procs)


FIXTURES = {
    "sglang_prefill_dp2_priority.prom": prefill_dp2_priority,
    "sglang_decode_dp2_priority.prom": decode_dp2_priority,
    "sglang_prefill_pp2_all_schedulers.prom": prefill_pp2_all_schedulers,
}


def main() -> int:
    for name, make in FIXTURES.items():
        doc = "".join(f"# {line.strip()}\n" for line in (make.__doc__ or "").splitlines())
        header = (
            f"# Generated by tests/remediation/data/make_sglang_fixtures.py; do not edit.\n"
            f"# Format of {SOURCE},\n"
            f"# served by prometheus-client in multiprocess mode (srt/utils/common.py).\n{doc}"
        )
        (HERE / name).write_text(header + make())
        print(f"wrote {HERE / name}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
