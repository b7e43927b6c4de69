"""Attacks on the KV control plane, performed against real worker processes (NIXL over UCX):
each is refused, and serving afterwards loses nothing (every request completes, no room of the
victim failed, checksums agree, both sides end clean).

Loopback stands in for a pod network: the victim decode listens on 127.0.0.3 (its "pod IP") and
the attacker calls from other 127.x addresses, which is how pods on the local cluster look.
"""

from __future__ import annotations

import base64
import json
import struct
import threading
import urllib.request
from collections.abc import Iterator
from http.client import HTTPConnection
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from bench.harness import (
    BOOTSTRAP_TOKEN,
    Proc,
    Workers,
    free_port,
    metric,
    scrape,
    wait_clean,
    wait_for,
)
from e2e.httpjson import http

from pdworker import contract as pdw

pytestmark = pytest.mark.nixl
VICTIM_IP = "127.0.0.3"
NIXL_TAG = b"nixlSerDes|Agent"


def call(
    port: int,
    path: str,
    body: Any,
    *,
    source: str = "127.0.0.1",
    token: str | None = BOOTSTRAP_TOKEN,
) -> tuple[int, dict[str, Any]]:
    """POST to the prefill's bootstrap server from a chosen source address."""
    conn = HTTPConnection("127.0.0.1", port, timeout=20, source_address=(source, 0))
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    try:
        conn.request("POST", path, body=data, headers=headers)
        resp = conn.getresponse()
        raw = resp.read()
    finally:
        conn.close()
    try:
        return resp.status, json.loads(raw)
    except ValueError:
        return resp.status, {"raw": raw[:200].decode(errors="replace")}


def decode_on(pd: Workers, ip: str, *extra: str) -> Proc:
    proc = pd.worker("decode", "--host", ip, *extra, wait=False)
    proc.url = f"http://{ip}:{proc.port}"
    pd.wait_ready(proc)
    return proc


def info(proc: Proc) -> dict[str, Any]:
    status, body = http("GET", f"{proc.url}/info")
    assert status == 200
    return body


def metadata_naming(agent: str, tail: bytes = b"|Conns\x00garbage") -> str:
    raw = NIXL_TAG + struct.pack("<Q", len(agent)) + agent.encode() + tail
    return base64.b64encode(raw).decode()


def registration(agent: str, address: str, metadata: str, pod: str) -> dict[str, Any]:
    return {
        "agent": agent,
        "pod": pod,
        "address": address,
        "incarnation": agent,
        "metadata": metadata,
        "layout": None,  # replaced below with the real layout
        "pool": {"base_addr": 1 << 30, "page_bytes": 0, "num_pages": 16, "device_id": 0,
                 "mem_type": "DRAM"},
    }  # fmt: skip


def failed(samples: dict, reason: str) -> float:
    return metric(samples, pdw.REQUESTS_FAILED, reason=reason)


def test_bootstrap_attacks_are_refused_and_serving_loses_nothing(pd: Workers) -> None:
    # A slow forward keeps rooms open long enough to attack them.
    prefill = pd.worker("prefill", "--prefill-chunk-ms", "150", "--chunk-pages", "1")
    decode = decode_on(pd, VICTIM_IP)
    router = pd.router([prefill], [decode])
    assert (
        pd.load(router, "--clients", "2", "--requests", "4", "--prompt-len", "4:8")["completed"]
        == 4
    )  # the victim decode is now a registered peer of the prefill
    victim = info(decode)
    agent, layout = victim["incarnation"], victim["layout"]
    port = prefill.bootstrap_port
    assert port is not None
    victim_address = f"{VICTIM_IP}:{decode.port}"

    def evil(agent_name: str, address: str, metadata: str) -> dict[str, Any]:
        body = registration(agent_name, address, metadata, pod=victim["pod"])
        body["layout"] = layout
        body["pool"]["page_bytes"] = layout["page_bytes"]
        return body

    garbage = evil("decode-evil-1", victim_address, metadata_naming("decode-evil-1"))
    # Keep a room of the victim open while the attacks run.
    background = pd.load_background(router, "--clients", "2", "--requests", "6",
                                    "--prompt-len", "24:32", "--output-len", "2")  # fmt: skip

    def open_rooms() -> list[int]:
        status, rooms = pd.admin(prefill, "GET", "/admin/rooms")
        assert status == 200
        mine = [r for r in rooms if r["peer"] and r["peer"]["incarnation"] == agent]
        # The rooms API names the peer by the address prefill verified, not by its own word.
        assert all(r["peer"]["ip"] == VICTIM_IP for r in mine)
        return [r["room"] for r in mine]

    room = wait_for(open_rooms, 30, "a room bound to the victim decode")[0]

    # 1. No key, or a wrong one: every bootstrap call is refused.
    for path in ("/bootstrap/peer", "/bootstrap/room", "/bootstrap/abort", "/bootstrap/heartbeat"):
        assert call(port, path, {"agent": agent, "room": room}, token=None)[0] == 401
        assert call(port, path, {"agent": agent, "room": room}, token="guess")[0] == 401
    # 2. Garbage NIXL metadata under the victim's address and pod name (from the victim's IP,
    #    with the key): refused before anything happens to the live peer.
    for metadata in (
        base64.b64encode(b"garbage").decode(),
        metadata_naming("decode-evil-1"),  # NIXL itself refuses the rest
        metadata_naming(agent),  # names the victim's agent, not the registering one
    ):
        status, body = call(port, "/bootstrap/peer", {**garbage, "metadata": metadata},
                            source=VICTIM_IP)  # fmt: skip
        assert status == 400, body
    # 3. Another address may not claim the victim's, nor act as its agent.
    status, body = call(port, "/bootstrap/peer", garbage, source="127.0.0.4")
    assert status == 403, body
    for path, extra in (("/bootstrap/heartbeat", {}), ("/bootstrap/abort", {"room": room}),
                        ("/bootstrap/room", {"room": room, "pages": [0]})):  # fmt: skip
        status, body = call(port, path, {"agent": agent, **extra}, source="127.0.0.4")
        assert status == 403, (path, body)
    # 4. A stranger's abort or re-binding of the victim's room is refused.
    assert call(port, "/bootstrap/abort", {"agent": "decode-evil-1", "room": room})[0] == 404
    status, body = call(port, "/bootstrap/room", {"agent": "decode-evil-1", "room": room,
                                                  "pages": [0]})  # fmt: skip
    assert status == 409 and body["reason"] == "peer_lost", body
    # 5. Oversized pools and bodies: refused, nothing built.
    huge = evil("decode-evil-2", "127.0.0.1:1", metadata_naming("decode-evil-2"))
    huge["pool"]["num_pages"] = 2**40
    assert call(port, "/bootstrap/peer", huge)[0] == 400
    assert call(port, "/bootstrap/peer", b"[" + b"0," * 400_000 + b"0]")[0] == 413

    background.wait(timeout=120)
    summary = pd.load(router, "--clients", "4", "--requests", "12", "--prompt-len", "4:16")
    assert summary["completed"] == 12, summary
    p, d = scrape(prefill.url), scrape(decode.url)
    for reason in ("peer_lost", "aborted", "transfer_error"):
        assert failed(p, reason) == 0 and failed(d, reason) == 0, reason
    assert metric(d, pdw.KV_CHECKSUM_MISMATCH) == 0
    wait_clean(pd, prefill)
    wait_clean(pd, decode)


class Recorder:
    """A bootstrap endpoint that is not a prefill of the deployment: it relays a real prefill's
    /bootstrap/info answer (same nonce) as its own and records everything it is sent."""

    def __init__(self, real_port: int) -> None:
        self.seen: list[tuple[str, str, str | None]] = []
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_: Any) -> None: ...

            def _record(self) -> None:
                recorder.seen.append((self.command, self.path, self.headers.get("Authorization")))

            def do_GET(self) -> None:
                self._record()
                url = f"http://127.0.0.1:{real_port}{self.path}"
                with urllib.request.urlopen(url, timeout=5) as resp:
                    body = resp.read()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:
                self._record()
                self.send_response(200)
                self.end_headers()

        self.port = free_port()
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def prefill_and_decode(pd: Workers) -> Iterator[tuple[Proc, Proc]]:
    prefill = pd.worker("prefill", wait=False)
    decode = decode_on(pd, VICTIM_IP)
    pd.wait_ready(prefill)
    yield prefill, decode


def test_decode_generate_is_no_ssrf(pd: Workers, prefill_and_decode: tuple[Proc, Proc]) -> None:
    prefill, decode = prefill_and_decode
    assert prefill.bootstrap_port is not None
    relay = Recorder(prefill.bootstrap_port)
    try:
        body = {"bootstrap_room": 11, "input_ids": [1, 2, 3], "max_new_tokens": 2,
                "bootstrap_host": "127.0.0.1", "bootstrap_port": relay.port}  # fmt: skip
        status, answer = http("POST", f"{decode.url}/generate", body, timeout=30)
        assert status == 403, answer
        assert "not a prefill of this deployment" in answer["error"]
        # The stranger heard one question and nothing else: no key, no metadata, no pool.
        assert [(m, p.split("?")[0], a) for m, p, a in relay.seen] == [
            ("GET", "/bootstrap/info", None)
        ]
    finally:
        relay.close()
    for host, port in (("example.com", 80), ("localhost", prefill.bootstrap_port), ("::1x", 1)):
        body = {"bootstrap_room": 12, "input_ids": [1], "bootstrap_host": host,
                "bootstrap_port": port}  # fmt: skip
        assert http("POST", f"{decode.url}/generate", body, timeout=30)[0] == 400
    # The real prefill of the deployment still serves through this decode, nothing lost.
    router = pd.router([prefill], [decode])
    assert pd.load(router, "--clients", "2", "--requests", "6")["completed"] == 6
    assert failed(scrape(decode.url), "transfer_error") == 1  # the refused relay room only
    wait_clean(pd, decode)


def test_prefill_allow_and_missing_key_are_clear_refusals(pd: Workers) -> None:
    prefill = pd.worker("prefill")
    assert prefill.bootstrap_port is not None
    fenced = pd.worker("decode", "--prefill-allow", "127.0.0.1:1,10.0.0.0/8")
    keyless = pd.worker("decode", bootstrap_token=False)
    body = {"bootstrap_room": 5, "input_ids": [1], "bootstrap_host": "127.0.0.1",
            "bootstrap_port": prefill.bootstrap_port}  # fmt: skip
    status, answer = http("POST", f"{fenced.url}/generate", body, timeout=30)
    assert status == 403 and "not allowed" in answer["error"], answer
    status, answer = http("POST", f"{keyless.url}/generate", body, timeout=30)
    assert status == 503 and "no bootstrap token" in answer["error"], answer
