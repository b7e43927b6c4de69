"""A real KubeClient against a loopback server that answers as an API server under load does.

API Priority and Fairness turns a request away before it runs with 429 and `Retry-After`
(measured on the local kube-apiserver: 1 s, doubling to 16 s while a level stays full). The
client sends it again after that pause, as client-go does, or after what its caller can spare
of it; an eviction's 429 is the disruption budget's answer and comes back at once. The server
records when each request came, so the pauses are read from its side.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from kubernetes import client as k8s

from pdwarden.k8s import ApiError, KubeClient, throttled_budget
from pdwarden.k8s.client import THROTTLED_PAUSE_MAX, THROTTLED_PAUSE_MIN, transport_retries
from pdwarden.k8s.foreign import evict_pod

THROTTLED = {"kind": "Status", "status": "Failure", "reason": "TooManyRequests", "code": 429,
             "message": "Too many requests, please try again later."}  # fmt: skip


@dataclass
class Crowded:
    """Refuses the first `refusals` requests (429, `Retry-After: retry_after`), then answers."""

    refusals: int
    retry_after: str | None = "1"
    seen: list[tuple[float, str, str]] = field(default_factory=list)  # (time, method, path)


@pytest.fixture
def crowded() -> Iterator[tuple[Crowded, str]]:
    state = Crowded(refusals=0)

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            state.seen.append((time.monotonic(), self.command, self.path))
            refused = len(state.seen) <= state.refusals
            body = json.dumps(THROTTLED if refused else {"kind": "Pod"}).encode()
            self.send_response(429 if refused else 200)
            if refused and state.retry_after is not None:
                self.send_header("Retry-After", state.retry_after)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_PATCH = _answer

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def client(url: str, timeout: float) -> KubeClient:
    config = k8s.Configuration(host=url)
    config.retries = transport_retries()  # as KubeClient.from_environment sets it
    return KubeClient(k8s.ApiClient(config), timeout=timeout)


def test_a_throttled_request_is_sent_again_after_the_pause_asked(
    crowded: tuple[Crowded, str],
) -> None:
    state, url = crowded
    state.refusals = 2
    pod = asyncio.run(client(url, timeout=10).get("v1", "Pod", "ns", "p"))
    assert pod == {"kind": "Pod"}
    times = [t for t, _, _ in state.seen]
    assert len(times) == 3
    # Each retry waited the second the server asked, at least (and not the longest pause).
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert all(1.0 <= g < THROTTLED_PAUSE_MAX for g in gaps), gaps


def test_throttled_to_the_end_of_its_deadline_the_call_fails_as_throttled(
    crowded: tuple[Crowded, str],
) -> None:
    state, url = crowded
    state.refusals = 1000
    started = time.monotonic()
    with pytest.raises(ApiError) as caught:
        asyncio.run(client(url, timeout=3).get("v1", "Pod", "ns", "p"))
    assert caught.value.status == 429 and caught.value.throttled and caught.value.transient
    # Tried again after each pause asked (1 s), the last one cut to what the deadline left;
    # none sent at or after the deadline.
    times = [t for t, _, _ in state.seen]
    assert 3 <= len(times) <= 4, state.seen
    assert times[-1] - started < 3
    assert all(b - a >= THROTTLED_PAUSE_MIN for a, b in itertools.pairwise(times))


def test_a_429_without_retry_after_is_an_answer_not_a_throttle(
    crowded: tuple[Crowded, str],
) -> None:
    state, url = crowded
    state.refusals, state.retry_after = 5, None
    with pytest.raises(ApiError) as caught:
        asyncio.run(client(url, timeout=10).get("v1", "Pod", "ns", "p"))
    assert caught.value.status == 429 and not caught.value.throttled
    assert len(state.seen) == 1


def test_an_eviction_refused_by_a_disruption_budget_comes_back_at_once(
    crowded: tuple[Crowded, str],
) -> None:
    """The eviction API's 429 (a PodDisruptionBudget forbids it now) carries a Retry-After too;
    it is the answer a PDRemediationPolicy records as HeldBack, never retried inside the call."""
    state, url = crowded
    state.refusals = 5
    outcome = asyncio.run(evict_pod(client(url, timeout=10), "ns", "p", "uid-1"))
    assert outcome.result == "HeldBack"
    assert [(m, p) for _, m, p in state.seen] == [("POST", "/api/v1/namespaces/ns/pods/p/eviction")]


def test_a_caller_on_a_clock_waits_out_throttling_no_longer_than_its_budget(
    crowded: tuple[Crowded, str],
) -> None:
    """A remediation cycle gives its calls its interval: a refused write fails in time for the
    next cycle (which scrapes and judges again), not at the end of the call's timeout."""
    state, url = crowded
    state.refusals = 1000

    async def main() -> None:
        with throttled_budget(1.0):
            await client(url, timeout=10).get("v1", "Pod", "ns", "p")

    with pytest.raises(ApiError) as caught:
        asyncio.run(main())
    assert caught.value.throttled
    # One more try, after what the second could spare of the pause asked; none after it.
    times = [t for t, _, _ in state.seen]
    assert len(times) == 2, state.seen
    assert THROTTLED_PAUSE_MIN <= times[1] - times[0] < 1.0


def test_a_client_with_another_timeout_shares_the_threads_and_the_pacing() -> None:
    """The foreign verbs (a PDRemediationPolicy's label and eviction) give each call its own
    deadline: the client they use then is the operator's, paced with every other call."""
    base = client("http://127.0.0.1:9", timeout=15)
    bounded = base.within(3)
    assert bounded.timeout == 3 and base.timeout == 15
    assert bounded._pool is base._pool and bounded._pacer is base._pacer
