"""Worker HTTP ports against hostile clients, with real processes and real sockets on loopback.

Slow-loris (connections that never finish their request head) on a prefill that may open only
512 files must not silence its probes or its bootstrap server; two dozen connections sending
large bodies slowly must not pin hundreds of MiB in a router. The parts (caps, deadlines, the
body budget) are checked one by one, in-process, in test_listen.py.
"""

from __future__ import annotations

import contextlib
import os
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from bench.harness import (
    BOOTSTRAP_TOKEN,
    LOOPBACK,
    SMALL,
    Proc,
    Workers,
    free_port,
    metric,
    scrape,
    wait_for,
)
from e2e.httpjson import http

from pdworker import contract as c
from pdworker import limits

pytestmark = pytest.mark.nixl
OPEN_FILES = 512  # the prefill's limit: slow-loris below could take every descriptor it has
SLOW_LORIS = 600
HEAD = b"GET /healthz HTTP/1.1\r\nHost: pdworker\r\nX-Slow: "  # never finished


def spawn_limited(pd: Workers, role: str, open_files: int, *extra: str) -> Proc:
    """`pd.worker(role)` whose process may open at most `open_files` files (soft and hard: it
    cannot raise them), set by the process itself before the worker starts."""
    port, bootstrap = free_port(), free_port()
    name = f"{role}-{port}"
    argv = [role, "--host", LOOPBACK, "--port", str(port), "--pod-name", name, *SMALL,
            "--bootstrap-port", str(bootstrap), "--admin-token-file", str(pd.token_file),
            "--bootstrap-token-file", str(pd.bootstrap_token_file), *extra]  # fmt: skip
    env = {**os.environ, "PDWORKER_FAULTS": ""}
    env.pop("POD_IP", None)
    log = pd.tmp / f"{name}.log"
    limited = ("import resource, runpy, sys; n = int(sys.argv.pop(1)); "
               "resource.setrlimit(resource.RLIMIT_NOFILE, (n, n)); "
               "runpy.run_module('pdworker.cli', run_name='__main__', alter_sys=True)")  # fmt: skip
    with open(log, "wb") as fh:
        popen = subprocess.Popen(
            [sys.executable, "-c", limited, str(open_files), *argv], stdout=fh,
            stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )  # fmt: skip
    proc = Proc(name, popen, f"http://{LOOPBACK}:{port}", log, port, argv, {}, bootstrap)
    pd.procs.append(proc)
    pd.wait_ready(proc)
    return proc


@contextlib.contextmanager
def slow_loris(port: int, count: int) -> Iterator[list[socket.socket]]:
    """`count` connections that each send part of a request head and then nothing."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < count + 256:
        pytest.skip(f"this test needs {count + 256} open files (hard limit {hard})")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, count + 256), hard))
    held: list[socket.socket] = []
    try:
        for _ in range(count):
            try:
                sock = socket.create_connection((LOOPBACK, port), timeout=1)
                sock.sendall(HEAD)
            except OSError:  # a server out of descriptors stops accepting: its backlog fills
                continue
            held.append(sock)
        yield held
    finally:
        for sock in held:
            sock.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def heartbeat(prefill: Proc) -> int:
    """A bootstrap heartbeat on a new connection (an agent prefill does not know: 200)."""
    url = f"http://{LOOPBACK}:{prefill.bootstrap_port}/bootstrap/heartbeat"
    status, _ = http("POST", url, {"agent": "decode-nobody"}, token=BOOTSTRAP_TOKEN, timeout=5)
    return status


def test_probes_and_heartbeats_answer_while_slow_loris_holds_the_public_port(
    pd: Workers,
) -> None:
    prefill = spawn_limited(pd, "prefill", OPEN_FILES)
    decode = pd.worker("decode")
    router = pd.router([prefill], [decode])
    assert pd.load(router, "--clients", "2", "--requests", "4")["completed"] == 4
    with slow_loris(prefill.port, SLOW_LORIS) as held:
        assert held  # the attack is on
        for path in (c.HEALTHZ_PATH, c.READYZ_PATH):
            assert http("GET", f"{prefill.url}{path}", timeout=5)[0] == 200, path
        assert heartbeat(prefill) == 200
    # The decode kept its link all along (no room lost as peer_lost), and serving goes on.
    summary = pd.load(router, "--clients", "2", "--requests", "6")
    assert summary["completed"] == 6, summary
    closed = scrape(prefill.url)
    assert metric(closed, c.HTTP_CONNECTIONS_CLOSED, reason="evicted") > 0
    assert metric(scrape(decode.url), c.REQUESTS_FAILED, reason="peer_lost") == 0


def test_a_request_head_that_never_ends_is_closed_at_its_deadline(pd: Workers) -> None:
    prefill = pd.worker("prefill")
    with socket.create_connection((LOOPBACK, prefill.port), timeout=5) as sock:
        sock.sendall(HEAD)
        sock.settimeout(limits.HEAD_TIMEOUT_S + 20)
        began = time.monotonic()
        try:
            rest = sock.recv(1024)
        except ConnectionResetError:
            rest = b""
        except TimeoutError:
            pytest.fail(f"the connection was still open after {time.monotonic() - began:.0f}s")
    assert rest == b""  # closed without an answer
    closed = scrape(prefill.url)
    assert metric(closed, c.HTTP_CONNECTIONS_CLOSED, reason="head_timeout") == 1


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_two_dozen_slow_large_bodies_do_not_pin_hundreds_of_mib(pd: Workers) -> None:
    port = free_port()
    router = pd.spawn("router", ["router", "--host", LOOPBACK, "--port", str(port),
                                 "--prefill", "http://127.0.0.1:1", "--decode",
                                 "http://127.0.0.1:1"], port)  # fmt: skip
    pd.wait_ready(router)
    before = rss_bytes(router.popen.pid)
    declared, sent = 11 << 20, 10 << 20  # each body stops 1 MiB short of what it declared
    head = (f"POST /generate HTTP/1.1\r\nHost: pdworker\r\nContent-Type: application/json\r\n"
            f"Content-Length: {declared}\r\n\r\n").encode()  # fmt: skip
    body = b'{"input_ids": [' + b"1," * ((sent - 16) // 2)
    answers: list[bytes] = []
    held: list[socket.socket] = []
    try:
        for _ in range(24):
            sock = socket.create_connection((LOOPBACK, port), timeout=10)
            held.append(sock)
            with contextlib.suppress(OSError):  # a refused body: the server closes on us
                sock.sendall(head + body)
        peak = rss_bytes(router.popen.pid)
        for sock in held:
            sock.settimeout(0.5)
            try:
                answers.append(sock.recv(200))
            except (TimeoutError, OSError):
                answers.append(b"")  # still being read (or waiting for the rest)
    finally:
        for sock in held:
            sock.close()
    budget = limits.INFLIGHT_BODY_BYTES
    refused = [a for a in answers if a.startswith(b"HTTP/1.1 503")]
    assert len(refused) >= 24 - budget // declared, answers
    assert peak - before < budget + (48 << 20), (before, peak)
    assert http("GET", f"{router.url}{c.HEALTHZ_PATH}", timeout=5)[0] == 200
    wait_for(lambda: http("GET", f"{router.url}{c.READYZ_PATH}", timeout=5)[0] == 200, 10,
             "router ready")  # fmt: skip
