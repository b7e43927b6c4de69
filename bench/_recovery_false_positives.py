"""bench.recovery's false-positive check: a healthy long prefill must draw no finding, no action.

Run on pdworker processes and on SGLang's simulated series; a control wedge afterwards must be
found, or zero findings would prove nothing.
"""

from __future__ import annotations

import time
from typing import Any

from e2e.httpjson import http

from bench import harness
from bench._metrics_sim import SglangPlayer
from bench._recovery_loop import SMALL, OperatorLoop, Pod, SimProc, remediation_spec


def long_prefill(settings: dict[str, Any]) -> dict[str, Any]:
    spec = remediation_spec(settings)
    slow = ["--prefill-chunk-ms", "100", "--chunk-pages", "1"]
    with harness.Workers() as w:
        prefill = w.worker("prefill", *SMALL, *slow)
        decodes = [w.worker("decode", *SMALL, name=f"decode-{i}") for i in range(2)]
        router = w.router([prefill], decodes)
        w.wait_ready(prefill, *decodes, router)
        loop = OperatorLoop(
            w, [Pod(prefill, "prefill"), *(Pod(d, "decode") for d in decodes)], spec
        ).start()
        t0 = time.monotonic()
        try:
            status, answer = http(
                "POST", f"{router.url}/generate",
                {"input_ids": list(range(1, 4 * 60)), "max_new_tokens": 2}, timeout=120,
            )  # fmt: skip
            took = time.monotonic() - t0
            time.sleep(spec.scrape_interval_seconds * 2)
        finally:
            loop.close()
    return {
        "request_ok": status == 200 and bool(answer.get("ok")),
        "request_seconds": took,
        "findings": loop.findings,
        "actions": len(loop.events),
        "false_positives": loop.findings + len(loop.events),
        "finding_log": loop.finding_log[:10],
        "action_log": loop.events[:10],
        "loop_errors": loop.errors,
    }


def long_prefill_sglang(settings: dict[str, Any]) -> dict[str, Any]:
    """long_prefill on stock SGLang's series (simulated engine, SGLang 0.5.23's format)."""
    spec = remediation_spec(settings)
    window = spec.wedge_after_seconds
    prefill_s = decode_s = 3.0 * window  # each three detection windows long
    t_sent = prefill_s + 1.0
    t_done = t_sent + decode_s
    control_s = window + 4.0 * spec.scrape_interval_seconds

    def timeline(pod: str, t: float) -> dict[str, float]:
        computed = 8192.0 * min(t, prefill_s)  # prompt tokens, per prefill step
        decoded = 5000.0 + 50.0 * max(0.0, min(t, t_done) - t_sent)  # per decode step
        if pod == "prefill-0":
            done = {"prefill_tokens": computed, "sent": 40 + (t >= t_sent), "finished": 40}
            if t < prefill_s:
                return {**done, "running": 1}
            if t < t_sent:
                return {**done, "inflight": 1}  # the KV transfer of the long prompt
            if t < t_done + 1.0:
                return {**done, "finished": 41}
            return {**done, "finished": 41, "inflight": 2}  # control: two rooms wedge
        if pod == "decode-0":
            common_ = {"decode_tokens": decoded, "generation_tokens_total": 8080, "finished": 120}
            if t < t_sent:  # waiting for the long prefill's KV
                return {**common_, "transfer": 1, "throughput": 0.0, "arrived": 150}
            if t < t_done:  # one long answer: finish-only counters flat
                return {**common_, "running": 1, "throughput": 50.0, "arrived": 151}
            return {"decode_tokens": decoded, "generation_tokens_total": 8080 + 50 * decode_s,
                    "finished": 121, "arrived": 151, "throughput": 0.0}  # fmt: skip
        return {"decode_tokens": 7000, "finished": 99, "arrived": 99, "throughput": 0.0}

    roles = {"prefill-0": "prefill", "decode-0": "decode", "decode-1": "decode"}
    with SglangPlayer(roles, timeline) as player:
        pods = [Pod(SimProc(name, player.ports[name]), role) for name, role in roles.items()]
        loop = OperatorLoop(None, pods, spec, engine="sglang").start()
        try:
            time.sleep(max(0.0, t_done + 1.0 - (time.monotonic() - player.t0)))
            findings, actions = loop.findings, len(loop.events)
            time.sleep(control_s)
        finally:
            loop.close()
    return {
        "engine": "sglang (simulated: SGLang 0.5.23 exposition format, bench._metrics_sim)",
        "prefill_seconds": prefill_s,
        "decode_seconds": decode_s,
        "findings": findings,
        "actions": actions,
        "false_positives": findings + actions,
        "control_wedge_findings": loop.findings - findings,
        "loop_errors": loop.errors,
    }
