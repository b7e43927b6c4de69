"""Admin API: token required, bad bodies rejected with a reason, failing a room is idempotent and
frees it on both sides; the decode-stall fault wedges decode while /healthz stays 200."""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

import pytest
from bench.harness import TOKEN, Workers, metric, scrape, wait_clean, wait_for
from e2e.httpjson import http

from pdworker import contract as c

pytestmark = pytest.mark.nixl


def test_admin_needs_a_configured_token(pd: Workers) -> None:
    bare = pd.worker("prefill", token=False)
    for method, path in (("GET", c.ADMIN_ROOMS_PATH), ("POST", c.ADMIN_ROOMS_FAIL_PATH)):
        status, body = http(method, f"{bare.url}{path}", {"rooms": [1]}, token=TOKEN)
        assert status == 403 and "no admin token configured" in body["error"]
    assert http("GET", f"{bare.url}/healthz")[0] == 200
    assert http("GET", f"{bare.url}/metrics")[0] == 200


def test_admin_auth_and_bad_bodies(pd: Workers) -> None:
    prefill, decode, _ = pd.trio()
    for proc in (prefill, decode):
        url = f"{proc.url}{c.ADMIN_ROOMS_PATH}"
        assert http("GET", url)[0] == 401
        assert http("GET", url, token="wrong")[0] == 403
        assert http("GET", url, token=TOKEN) == (200, [])
        fail = f"{proc.url}{c.ADMIN_ROOMS_FAIL_PATH}"
        assert http("POST", fail, {"rooms": [1]})[0] == 401
        assert http("POST", fail, {"rooms": [1]}, token="wrong")[0] == 403
        bad: list[Any] = [
            [1, 2],
            {},
            {"rooms": []},
            {"rooms": "1"},
            {"rooms": [True]},
            {"rooms": [-1]},
            {"rooms": [2**63]},
            {"older_than_seconds": -1},
            {"older_than_seconds": "10"},
            {"peer_incarnation": ""},
            {"rooms": [1], "older_than_seconds": 5},
            {"room": [1]},
        ]
        for body in bad:
            status, answer = http("POST", fail, body, token=TOKEN)
            assert status == 400 and answer["error"], (body, status, answer)
        status, answer = http("POST", fail, raw=b"not json", token=TOKEN)
        assert status == 400 and "JSON" in answer["error"]
        assert http("POST", fail, {"rooms": [12345]}, token=TOKEN) == (200, {"failed": []})


def _slow_request(router_url: str, results: list) -> threading.Thread:
    """A /generate request in a thread the test joins before it ends (an answer, or the error
    that ended it, lands in `results`)."""

    def run() -> None:
        body = {"input_ids": list(range(64)), "max_new_tokens": 2}
        try:
            results.append(http("POST", f"{router_url}/generate", body, timeout=60))
        except OSError as e:  # the router went away under the request
            results.append((0, {"error": f"{type(e).__name__}: {e}"}))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("side", ["prefill", "decode"])
def test_failing_a_room_is_idempotent_and_frees_both_sides(pd: Workers, side: str) -> None:
    # 300 ms per one-page chunk: the room lives on both sides for seconds.
    prefill, decode, router = pd.trio("--prefill-chunk-ms", "300", "--chunk-pages", "1")
    target = prefill if side == "prefill" else decode
    results: list = []
    thread = _slow_request(router.url, results)

    def live_room() -> int | None:
        p_rooms = pd.admin(prefill, "GET", c.ADMIN_ROOMS_PATH)[1]
        d_rooms = pd.admin(decode, "GET", c.ADMIN_ROOMS_PATH)[1]
        if p_rooms and d_rooms and p_rooms[0]["phase"] == "forward":
            assert p_rooms[0]["room"] == d_rooms[0]["room"]
            assert d_rooms[0]["peer"]["incarnation"].startswith("prefill-")
            return int(p_rooms[0]["room"])
        return None

    room = wait_for(live_room, 20, "a room alive on both sides")
    status, answer = pd.admin(target, "POST", c.ADMIN_ROOMS_FAIL_PATH, {"rooms": [str(room)]})
    assert (status, answer) == (200, {"failed": [room]})
    status, answer = pd.admin(target, "POST", c.ADMIN_ROOMS_FAIL_PATH, {"rooms": [room]})
    assert (status, answer) == (200, {"failed": []})  # idempotent
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert results and results[0][0] >= 500, results
    assert results[0][1]["reason"] in ("admin", "aborted")
    for proc in (prefill, decode):
        wait_clean(pd, proc)
    assert metric(scrape(target.url), c.REQUESTS_FAILED, reason="admin") == 1


def test_decode_stall_wedges_decode_while_health_stays_green(pd: Workers) -> None:
    prefill, decode, router = pd.trio(decode_extra=("--fault", "decode-stall"))
    assert http("POST", f"{router.url}/generate", {"input_ids": [1, 2, 3]})[0] == 200
    assert pd.admin(prefill, "POST", c.ADMIN_DECODE_STALL_PATH)[0] == 404  # decode-only
    assert pd.admin(decode, "POST", c.ADMIN_DECODE_STALL_PATH) == (200, {"stalled": True})
    tokens = metric(scrape(decode.url), c.GENERATED_TOKENS)
    results: list = []
    threads = [_slow_request(router.url, results) for _ in range(3)]
    wait_for(
        lambda: metric(scrape(decode.url), c.DECODE_TRANSFER_QUEUE) == 3,
        10, "requests parked on the stalled decode",
    )  # fmt: skip
    s = scrape(decode.url)
    assert metric(s, c.DECODE_RUNNING) == 0
    assert metric(s, c.GENERATED_TOKENS) == tokens
    assert http("GET", f"{decode.url}/healthz")[0] == 200
    # Prefill finished its side (one-sided WRITEs), so only decode holds the stuck rooms.
    wait_for(lambda: pd.admin(prefill, "GET", c.ADMIN_ROOMS_PATH)[1] == [], 10, "prefill done")
    assert not results and all(t.is_alive() for t in threads)
    # The parked requests never finish on their own: end them by killing the router under them,
    # so no thread outlives the test with a 60 s request.
    os.killpg(router.popen.pid, signal.SIGKILL)
    router.popen.wait(timeout=10)
    for t in threads:
        t.join(timeout=10)
    assert not any(t.is_alive() for t in threads)
    assert len(results) == 3 and all(code != 200 for code, _ in results), results


def test_dropped_notifications_end_in_waiting_timeout_not_a_hang(pd: Workers) -> None:
    prefill, decode, router = pd.trio(
        decode_extra=("--fault", "drop-notifications=1", "--waiting-timeout", "1")
    )
    status, body = http("POST", f"{router.url}/generate", {"input_ids": list(range(20))})
    assert status >= 500 and body["reason"] == "waiting_timeout", body
    for proc in (prefill, decode):
        wait_clean(pd, proc)
    d = scrape(decode.url)
    assert metric(d, c.REQUESTS_FAILED, reason="waiting_timeout") == 1
