"""Integrity: requests through router, prefill and decode move exactly the KV the model computes."""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch
from pdharness import PD, http, metric, scrape, wait_clean

from pdworker.model import ModelConfig, TinyModel, kv_checksum

pytestmark = pytest.mark.nixl
CFG = ModelConfig(layers=2, heads=2, head_dim=16, page_size=4, vocab=1024)


def expected(ids: list[int], max_new: int) -> tuple[str, list[int]]:
    torch.set_num_threads(1)
    model = TinyModel(CFG, torch.device("cpu"))
    kv, first = model.prefill(ids)
    tokens = [first]
    for _ in range(max_new - 1):
        tokens.append(model.decode_step(kv, tokens[-1]))
    return kv_checksum(kv), tokens


def test_200_requests_checksums_and_metrics_agree(pd: PD) -> None:
    prefill, decode, router = pd.trio()

    # A few requests whose KV we recompute here: the bytes decode received are the model's.
    for ids, max_new in (([5], 1), (list(range(1, 22)), 4), ([7] * 37, 3), (list(range(100)), 2)):
        status, body = http(
            "POST", f"{router.url}/generate", {"input_ids": ids, "max_new_tokens": max_new}
        )
        assert status == 200, body
        checksum, tokens = expected(ids, max_new)
        assert body["kv_checksum"] == checksum
        assert body["output_ids"] == tokens

    summary = pd.load(router, "--clients", "10", "--requests", "200", "--prompt-len", "1:96",
                      "--output-len", "1:8", "--seed", "1")  # fmt: skip
    assert summary["completed"] == 200, summary
    assert summary["failed_total"] == 0 and summary["cancelled"] == 0

    wait_clean(pd, prefill)
    wait_clean(pd, decode)
    p, d, r = scrape(prefill.url), scrape(decode.url), scrape(router.url)
    direct = 4
    assert metric(d, "pdworker_requests_completed_total", role="decode") == 200 + direct
    assert metric(p, "pdworker_requests_completed_total", role="prefill") == 200 + direct
    assert metric(r, "pdworker_requests_completed_total", role="router") == 200 + direct
    direct_tokens = 1 + 4 + 3 + 2
    assert (
        metric(d, "pdworker_generated_tokens_total") == summary["generated_tokens"] + direct_tokens
    )
    moved = metric(p, "pdworker_kv_transfer_bytes_total")
    page_bytes = CFG.page_bytes
    direct_bytes = sum(CFG.pages_for(n) for n in (1, 21, 37, 100)) * page_bytes
    assert moved == summary["kv_bytes"] + direct_bytes
    assert metric(p, "pdworker_kv_transfer_seconds_count") == 200 + direct
    for samples in (p, d):
        assert metric(samples, "pdworker_kv_checksum_mismatch_total") == 0
        assert metric(samples, "pdworker_kv_pages_free") == metric(
            samples, "pdworker_kv_pages_total"
        )
        for reason in ("aborted", "transfer_error", "peer_lost", "waiting_timeout"):
            assert metric(samples, "pdworker_requests_failed_total", reason=reason) == 0
    incarnations = [k for k in p if k[0] == "pdworker_incarnation_info"]
    assert len(incarnations) == 1 and dict(incarnations[0][1])["incarnation"].startswith("prefill-")


def test_bad_generate_bodies_are_4xx_with_a_reason(pd: PD) -> None:
    prefill, decode, router = pd.trio()
    for url in (router.url, decode.url, prefill.url):
        for body in ({"input_ids": []}, {"input_ids": "abc"}, {"input_ids": [1, -2]}, [1, 2]):
            status, answer = http("POST", f"{url}/generate", body)
            assert 400 <= status < 500, (url, body, status)
            assert answer["error"]
        status, answer = http("POST", f"{url}/generate", raw=b"{not json")
        assert status == 400 and "JSON" in answer["error"]


def test_sigterm_stops_every_process_cleanly(pd: PD) -> None:
    prefill, decode, router = pd.trio()
    assert http("POST", f"{router.url}/generate", {"input_ids": [1, 2, 3]})[0] == 200
    for proc in (router, decode, prefill):
        started = time.monotonic()
        os.kill(proc.popen.pid, signal.SIGTERM)
        assert proc.popen.wait(timeout=20) == 0, proc.log.read_text()[-2000:]
        assert time.monotonic() - started < 15
