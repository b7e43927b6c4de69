"""Integrity: requests through router, prefill and decode move exactly the KV the model computes."""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch
from bench.harness import SMALL, Workers, metric, scrape, wait_clean
from e2e.httpjson import http

from pdworker import contract as pdw
from pdworker import integrity
from pdworker.model import KVPool, ModelConfig, TinyModel, pick_device

pytestmark = pytest.mark.nixl
CFG = ModelConfig(layers=2, heads=2, head_dim=16, page_size=4, vocab=1024)
CHUNK_PAGES = int(SMALL[SMALL.index("--chunk-pages") + 1])


def expected(ids: list[int], max_new: int, checksum: str) -> tuple[str, list[int]]:
    """What the worker must answer, computed the way it computes it and ON ITS DEVICE.

    The worker's `--device auto` picks CUDA when there is one: float results differ between
    devices (and between matmul shapes), so the KV is computed here on that device, in the
    worker's chunks, and fingerprinted over the same pages the checksum string names.
    """
    torch.set_num_threads(1)
    device = pick_device("auto")
    model = TinyModel(CFG, device)
    npages = CFG.pages_for(len(ids))
    pool = KVPool(CFG, npages, device)
    span = CHUNK_PAGES * CFG.page_size
    for c in range(0, len(ids), span):
        kv, last = model.prefill_chunk(ids[c : c + span])
        first_page = c // CFG.page_size
        pool.write_tokens(list(range(first_page, min(npages, first_page + CHUNK_PAGES))), kv)
    spec = integrity.decode_spec(checksum)
    assert spec is not None, checksum
    pages = list(range(npages))
    kv_last = pool.read_tokens(pages, len(ids), layers=slice(-1, None))
    tokens = [model.first_token(last)]
    for _ in range(max_new - 1):
        tokens.append(model.decode_step(kv_last, tokens[-1]))
    return integrity.checksum(pool.tensor, pages, spec), tokens


def test_200_requests_checksums_and_metrics_agree(pd: Workers) -> None:
    prefill, decode, router = pd.trio("--kv-verify", "full")

    # A few requests whose KV we recompute here: the bytes decode received are the model's.
    for ids, max_new in (([5], 1), (list(range(1, 22)), 4), ([7] * 37, 3), (list(range(100)), 2)):
        status, body = http(
            "POST", f"{router.url}/generate", {"input_ids": ids, "max_new_tokens": max_new}
        )
        assert status == 200, body
        assert body["kv_checksum"].startswith(f"full.{CFG.pages_for(len(ids))}.")
        checksum, tokens = expected(ids, max_new, body["kv_checksum"])
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
    assert metric(d, pdw.REQUESTS_COMPLETED, role="decode") == 200 + direct
    assert metric(p, pdw.REQUESTS_COMPLETED, role="prefill") == 200 + direct
    assert metric(r, pdw.REQUESTS_COMPLETED, role="router") == 200 + direct
    direct_tokens = 1 + 4 + 3 + 2
    assert metric(d, pdw.GENERATED_TOKENS) == summary["generated_tokens"] + direct_tokens
    moved = metric(p, pdw.KV_TRANSFER_BYTES)
    page_bytes = CFG.page_bytes
    direct_bytes = sum(CFG.pages_for(n) for n in (1, 21, 37, 100)) * page_bytes
    assert moved == summary["kv_bytes"] + direct_bytes
    assert metric(p, f"{pdw.KV_TRANSFER_SECONDS}_count") == 200 + direct
    for samples in (p, d):
        assert metric(samples, pdw.KV_CHECKSUM_MISMATCH) == 0
        assert metric(samples, pdw.KV_PAGES_FREE) == metric(samples, pdw.KV_PAGES_TOTAL)
        for reason in ("aborted", "transfer_error", "peer_lost", "waiting_timeout"):
            assert metric(samples, pdw.REQUESTS_FAILED, reason=reason) == 0
    incarnations = [k for k in p if k[0] == pdw.INCARNATION_INFO]
    assert len(incarnations) == 1 and dict(incarnations[0][1])["incarnation"].startswith("prefill-")


def test_a_flipped_byte_in_a_landed_page_is_caught_with_the_default_verify(pd: Workers) -> None:
    # corrupt-kv=1: decode flips one random bit of one random byte of a landed page in every
    # room, before checking. With the default `--kv-verify sample` a one-page room is checked
    # whole, so every such room must fail, be counted, and nothing may leak.
    prefill, decode, router = pd.trio(decode_extra=("--fault", "corrupt-kv=1"))
    for i in range(20):
        ids = [(i * 31 + j) % 1024 for j in range(1 + i % CFG.page_size)]
        status, body = http("POST", f"{router.url}/generate", {"input_ids": ids})
        assert status == 500 and body["reason"] == "transfer_error", body
    wait_clean(pd, prefill)
    wait_clean(pd, decode)
    d = scrape(decode.url)
    assert metric(d, pdw.KV_CHECKSUM_MISMATCH) == 20
    assert metric(d, pdw.REQUESTS_COMPLETED, role="decode") == 0
    # And the same requests without the fault all pass the check (the check is not just "fail").
    _prefill2, decode2, router2 = pd.trio()
    for i in range(20):
        ids = [(i * 31 + j) % 1024 for j in range(1 + i % CFG.page_size)]
        assert http("POST", f"{router2.url}/generate", {"input_ids": ids})[0] == 200
    assert metric(scrape(decode2.url), pdw.KV_CHECKSUM_MISMATCH) == 0


def test_bad_generate_bodies_are_4xx_with_a_reason(pd: Workers) -> None:
    prefill, decode, router = pd.trio()
    for url in (router.url, decode.url, prefill.url):
        for body in ({"input_ids": []}, {"input_ids": "abc"}, {"input_ids": [1, -2]}, [1, 2]):
            status, answer = http("POST", f"{url}/generate", body)
            assert 400 <= status < 500, (url, body, status)
            assert answer["error"]
        status, answer = http("POST", f"{url}/generate", raw=b"{not json")
        assert status == 400 and "JSON" in answer["error"]


def test_sigterm_stops_every_process_cleanly(pd: Workers) -> None:
    prefill, decode, router = pd.trio()
    assert http("POST", f"{router.url}/generate", {"input_ids": [1, 2, 3]})[0] == 200
    for proc in (router, decode, prefill):
        started = time.monotonic()
        os.kill(proc.popen.pid, signal.SIGTERM)
        assert proc.popen.wait(timeout=20) == 0, proc.log.read_text()[-2000:]
        assert time.monotonic() - started < 15
