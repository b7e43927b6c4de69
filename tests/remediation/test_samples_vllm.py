"""The vLLM table (engines/vllm.py METRICS) on /metrics bodies captured from REAL vLLM 0.32 servers.

data/vllm_decode_stuck_read.prom: a decode 20 s into a KV read from a prefill whose engine
processes were SIGSTOPped (the read stays `in_progress`, no transfer finishes, /health 200).
data/vllm_prefill_late_notification.prom: a prefill after a decode's engine was frozen past the
30 s KV lease (one request's blocks expired) and then resumed and read them anyway (one
notification after expiry, counted at the prefill's next step). Both came from the pair that
e2e/vllm runs (`vllm serve`, NixlConnector, CPU), unedited.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pdwarden import engines as engine_metrics
from pdwarden.engines import vllm
from pdwarden.remediation.scrape.samples import ScrapeError, parse_metrics

DATA = Path(__file__).parent / "data"


def body(name: str) -> str:
    return (DATA / name).read_text()


def test_a_decode_stuck_on_a_frozen_prefill_reads_as_a_transfer_queue_without_transfers() -> None:
    s = parse_metrics(body("vllm_decode_stuck_read.prom"), 1.0, "vllm")
    assert s.reading_queue == 1  # stage in_progress: the read it posted, waiting on prefill
    assert s.transfer_queue == 0  # stage waiting_to_start: no handshake pending
    assert s.waiting_queue == 1 and s.running == 0
    assert s.kv_transfers == 4  # nixl_xfer_time_seconds_count: the four reads that finished
    assert s.generated_tokens == 44 and s.prefill_tokens == 48
    assert s.completed == 4  # request_success_total summed over finished_reason
    assert s.failed == 0


def test_a_prefill_that_saw_an_expiry_and_a_late_read_reports_both() -> None:
    s = parse_metrics(body("vllm_prefill_late_notification.prom"), 1.0, "vllm")
    assert s.kv_expired == 1 and s.late_notifications == 1
    assert s.reading_queue is None  # kv_producer: vLLM registers no kv_fetch gauge on prefill


def test_engines_behind_one_api_server_are_summed_and_other_engines_are_not_read() -> None:
    """--data-parallel-size N: one copy per engine core (label `engine`), each its own work."""
    text = body("vllm_decode_stuck_read.prom")
    second = [
        line.replace('engine="0"', 'engine="1"')
        for line in text.splitlines()
        if line.startswith(("vllm:num_requests_kv_fetch_by_stage", "vllm:generation_tokens"))
    ]
    s = parse_metrics(text + "\n".join(second) + "\n", 1.0, "vllm")
    assert s.reading_queue == 2 and s.generated_tokens == 88
    with pytest.raises(ScrapeError, match="no pdworker, SGLang or vLLM"):
        parse_metrics(text, 1.0, "sglang")  # a vLLM body has none of SGLang's names


def test_only_counters_that_move_per_step_feed_progress() -> None:
    by_target = {s.target: s.name for s in vllm.METRICS.series}
    assert by_target["generated_tokens"] == "vllm:generation_tokens_total"
    assert "kv_expired" in engine_metrics.COUNTER_FIELDS
    assert "late_notifications" in engine_metrics.COUNTER_FIELDS


def test_prompt_tokens_by_source_tell_transferred_from_recomputed() -> None:
    """A decode's prompts arrive by KV transfer (48 of 48 tokens external); a prefill computes
    its own. Cache hits are neither."""
    d = parse_metrics(body("vllm_decode_stuck_read.prom"), 1.0, "vllm")
    assert (d.transferred_tokens, d.recomputed_tokens, d.prefill_tokens) == (48, 0, 48)
    p = parse_metrics(body("vllm_prefill_late_notification.prom"), 1.0, "vllm")
    assert (p.transferred_tokens, p.recomputed_tokens, p.prefill_tokens) == (0, 100, 100)
    assert {"recomputed_tokens", "transferred_tokens"} <= set(engine_metrics.COUNTER_FIELDS)
