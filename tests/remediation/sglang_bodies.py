"""Time series of SGLang /metrics bodies in SGLang's real exposition format, for detection tests.

Each body starts from a fixture that data/make_sglang_fixtures.py wrote with prometheus-client in
multiprocess mode and sglang 0.5.23's names and labels (two DP ranks, priority scheduling); only
numbers are changed. A value is put on DP rank 0 (every TP copy, the priority="" total and
priority "0"); DP rank 1 and priority "1" read 0, so the parser must pick the right series.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from pdwarden.samples import Sample, parse_metrics

DATA = Path(__file__).parent / "data"
BASE = {
    "prefill": (DATA / "sglang_prefill_dp2_priority.prom").read_text(),
    "decode": (DATA / "sglang_decode_dp2_priority.prom").read_text(),
}
_STAGES = "sglang:per_stage_req_latency_seconds"
# Sample-level knob -> (series name, label selection).
KNOBS: dict[str, tuple[str, dict[str, str]]] = {
    "running": ("sglang:num_running_reqs", {}),
    "waiting": ("sglang:num_queue_reqs", {}),
    "inflight": ("sglang:num_prefill_inflight_queue_reqs", {}),
    "bootstrap": ("sglang:num_prefill_bootstrap_queue_reqs", {}),
    "prealloc": ("sglang:num_decode_prealloc_queue_reqs", {}),
    "transfer": ("sglang:num_decode_transfer_queue_reqs", {}),
    "throughput": ("sglang:gen_throughput", {}),
    "decode_tokens": ("sglang:realtime_tokens_total", {"mode": "decode"}),
    "prefill_tokens": ("sglang:realtime_tokens_total", {"mode": "prefill_compute"}),
    "sent": (f"{_STAGES}_count", {"stage": "prefill_transfer_kv_cache"}),
    "arrived": (f"{_STAGES}_count", {"stage": "decode_transferred"}),
    "transfer_failed": ("sglang:num_transfer_failed_reqs_total", {}),
    "bootstrap_failed": ("sglang:num_bootstrap_failed_reqs_total", {}),
    "finished": ("sglang:num_requests_total", {}),
    "generation_tokens_total": ("sglang:generation_tokens_total", {}),
}


def _set(text: str, name: str, value: float, select: dict[str, str]) -> str:
    lines = text.split("\n")
    first_plain = True
    for i, line in enumerate(lines):
        if not line.startswith(name + "{") or any(
            f'{k}="{v}"' not in line for k, v in select.items()
        ):
            continue
        if 'dp_rank="' in line:
            primary = 'dp_rank="0"' in line and 'priority="1"' not in line
        else:  # tokenizer series: one per is_streaming/priority; the first carries the value
            primary, first_plain = first_plain, False
        lines[i] = f"{line.rsplit(' ', 1)[0]} {float(value if primary else 0)!r}"
    return "\n".join(lines)


# Queues start empty unless a test sets them (the fixtures hold a loaded moment).
EMPTY = {
    "prefill": {"inflight": 0, "bootstrap": 0, "waiting": 0, "running": 0},
    "decode": {"running": 0, "waiting": 0, "prealloc": 0, "transfer": 0},
}


def body(role: str, **values: float) -> str:
    text = BASE[role]
    for knob, value in {**EMPTY[role], **values}.items():
        name, select = KNOBS[knob]
        text = _set(text, name, value, select)
        if name.endswith("_count"):  # keep the histogram consistent: +Inf bucket == count
            text = _set(text, name[: -len("_count")] + "_bucket", value, {**select, "le": "+Inf"})
    return text


Knob = float | list[float] | Callable[[int], float]


def series(
    role: str, n: int, step: float = 5.0, start: float = 1000.0, **knobs: Knob
) -> tuple[Sample, ...]:
    """n parsed samples `step` seconds apart; a knob is a constant, a list, or f(i)."""
    out = []
    for i in range(n):
        values: dict[str, Any] = {
            k: (v[i] if isinstance(v, list) else v(i) if callable(v) else v)
            for k, v in knobs.items()
        }
        out.append(parse_metrics(body(role, **values), start + i * step, engine="sglang"))
    return tuple(out)
