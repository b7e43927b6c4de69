"""Peer loss: kill -9 of decode mid-transfer fails prefill's rooms within the peer-loss deadline
(not an engine default of minutes), and a restarted decode (new incarnation) works at once."""

from __future__ import annotations

import os
import signal
import time

import pytest
from bench.harness import Workers, metric, scrape, wait_clean, wait_for

from pdworker import contract as pdw

pytestmark = pytest.mark.nixl
PEER_TIMEOUT = 3.0  # conftest SMALL: --peer-timeout 3, heartbeats every 0.5 s


def test_kill_decode_mid_transfer_then_restart(pd: Workers) -> None:
    # A slow forward (50 ms per page) keeps rooms bound to decode for about a second each.
    prefill, decode, router = pd.trio(
        "--prefill-chunk-ms", "50", "--chunk-pages", "1", "--bootstrap-timeout", "5"
    )  # fmt: skip
    old = scrape(decode.url)
    old_incarnation = next(dict(k[1])["incarnation"] for k in old if k[0] == pdw.INCARNATION_INFO)
    pd.load_background(router, "--clients", "8", "--duration", "30", "--prompt-len", "40:80",
                       "--output-len", "1:4", "--timeout", "20")  # fmt: skip

    def bound_rooms() -> list[dict]:
        status, rooms = pd.admin(prefill, "GET", "/admin/rooms")
        assert status == 200
        return [r for r in rooms if r["peer"] and r["peer"]["incarnation"] == old_incarnation]

    bound = wait_for(lambda: len(bound_rooms()) >= 3 and bound_rooms(), 20, "rooms bound to decode")
    os.killpg(decode.popen.pid, signal.SIGKILL)
    decode.popen.wait(timeout=10)
    killed = time.monotonic()

    def gone() -> bool:
        status, rooms = pd.admin(prefill, "GET", "/admin/rooms")
        live = {
            r["room"] for r in rooms if r["peer"] and r["peer"]["incarnation"] == old_incarnation
        }
        return status == 200 and not live & {r["room"] for r in bound}

    wait_for(gone, PEER_TIMEOUT + 4, "prefill to fail the dead decode's rooms")
    elapsed = time.monotonic() - killed
    assert elapsed < PEER_TIMEOUT + 4
    p = scrape(prefill.url)
    lost = metric(p, pdw.REQUESTS_FAILED, reason="peer_lost") + metric(
        p, pdw.REQUESTS_FAILED, reason="transfer_error"
    )
    assert lost >= 1, "rooms bound to the dead decode must fail as peer_lost/transfer_error"

    # A new decode incarnation on the same address works immediately.
    new = pd.worker("decode", port=decode.port)
    new_incarnation = next(
        dict(k[1])["incarnation"] for k in scrape(new.url) if k[0] == pdw.INCARNATION_INFO
    )
    assert new_incarnation != old_incarnation
    for proc in pd.procs:
        if proc.name == "load" and proc.alive():
            os.killpg(proc.popen.pid, signal.SIGTERM)
            proc.popen.wait(timeout=10)
    summary = pd.load(router, "--clients", "4", "--requests", "20", "--prompt-len", "4:16",
                      "--output-len", "1:4")  # fmt: skip
    assert summary["completed"] == 20, summary
    wait_clean(pd, prefill)
    wait_clean(pd, new)
    assert metric(scrape(new.url), pdw.KV_CHECKSUM_MISMATCH) == 0
