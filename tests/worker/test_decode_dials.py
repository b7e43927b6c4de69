"""Decode's `/generate` dials only allowed bootstrap endpoints and never echoes what it found.

In-process decode workers with real sockets on loopback: a listener counts every connection it
is offered, so "refused before connecting" is what the kernel saw, not what the code says.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from test_trust_fuzz import KEY, MODEL, RecordingTransport

from pdworker import allow as allow_module
from pdworker.allow import PrefillAllow
from pdworker.config import WorkerConfig
from pdworker.contract import DEFAULT_HTTP_PORT
from pdworker.decode import DecodeWorker
from pdworker.discovery import running_pod_ports
from pdworker.model import KVPool, TinyModel

HOST = "127.0.0.1"


def decode_worker(*allow: str) -> DecodeWorker:
    cfg = WorkerConfig(role="decode", pod="d0", model=MODEL, bootstrap_token=KEY,
                       prefill_allow=allow)  # fmt: skip
    device = torch.device("cpu")
    return DecodeWorker(cfg, TinyModel(MODEL, device), KVPool(MODEL, 16, device),
                        RecordingTransport("d"))  # type: ignore[arg-type]  # fmt: skip


class Listener:
    """A TCP port that counts connections; `mode`: what it does with one."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.accepted = 0
        self.sock = socket.socket()
        self.sock.bind((HOST, 0))
        self.sock.listen(16)
        self.port = int(self.sock.getsockname()[1])
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            with conn:
                if self.mode == "http":  # answers like a web server that is no prefill
                    conn.recv(65536)
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")


@contextmanager
def listening(mode: str) -> Iterator[Listener]:
    listener = Listener(mode)
    try:
        yield listener
    finally:
        listener.sock.close()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def body(port: int) -> dict[str, Any]:
    return {"bootstrap_room": 7, "input_ids": [1, 2], "max_new_tokens": 1,
            "bootstrap_host": HOST, "bootstrap_port": port}  # fmt: skip


def run(d: DecodeWorker, check: Callable[[TestClient], Awaitable[None]]) -> None:
    app = web.Application()
    app.router.add_post("/generate", d.handle_generate)

    async def main() -> None:
        await d.links.start()
        try:
            async with TestClient(TestServer(app, host=HOST)) as client:
                await check(client)
        finally:
            await d.links.close()

    asyncio.run(main())


def refused(d: DecodeWorker, reason: str) -> float:
    return d.metrics.endpoints_refused.labels(reason=reason)._value.get()  # type: ignore[no-any-return]


@pytest.mark.parametrize("allow", [(), ("127.0.0.1:1", "10.0.0.0/8")])
def test_an_endpoint_that_is_not_allowed_is_never_dialled(allow: tuple[str, ...]) -> None:
    d = decode_worker(*allow)
    with listening("http") as target:

        async def check(client: TestClient) -> None:
            resp = await client.post("/generate", json=body(target.port))
            answer = await resp.json()
            assert resp.status == 403, answer
            assert str(target.port) not in answer["error"]
            assert len(d.table) == 0 and not d.links.links

        run(d, check)
        assert target.accepted == 0  # refused before connecting
    assert refused(d, "not_allowed") == 1


def test_what_is_at_an_allowed_endpoint_is_logged_not_told() -> None:
    """A closed port and a port that hangs up say the same to the client; nothing of the
    connection error (errno, exception names, the address) reaches the answer."""
    d = decode_worker("127.0.0.0/8")
    answers: list[tuple[int, dict[str, Any]]] = []
    with listening("hang-up") as hangs_up:

        async def check(client: TestClient) -> None:
            for room, port in enumerate((closed_port(), hangs_up.port)):
                resp = await client.post("/generate", json={**body(port), "bootstrap_room": room})
                answers.append((resp.status, await resp.json()))

        run(d, check)
        assert hangs_up.accepted >= 1  # (aiohttp asks a GET again once the peer hung up)
    (s1, a1), (s2, a2) = answers
    assert (s1, a1["error"], a1["reason"]) == (s2, a2["error"], a2["reason"]), answers
    text = repr(answers)
    for leak in ("rrno", "Error", "onnect", "refused", str(hangs_up.port), "127.0.0.1:"):
        assert leak not in text, (leak, answers)
    assert refused(d, "unreachable") == 2


def test_an_http_endpoint_without_the_key_is_untrusted_in_fixed_words() -> None:
    d = decode_worker("127.0.0.0/8")
    with listening("http") as stranger:

        async def check(client: TestClient) -> None:
            resp = await client.post("/generate", json=body(stranger.port))
            answer = await resp.json()
            assert resp.status == 403, answer
            assert answer["error"] == "the bootstrap endpoint is not a prefill of this deployment"

        run(d, check)
    assert refused(d, "untrusted") == 1


class FakePods:
    """discovery.PodPorts as the API server would fill it: pods appear when the test says."""

    def __init__(self) -> None:
        self.pods: list[dict[str, Any]] = []
        self.shown: frozenset[tuple[str, int]] = frozenset()
        self.listings = 0
        self.listed = True

    def endpoints(self) -> frozenset[tuple[str, int]]:
        return self.shown

    def refresh(self) -> bool:
        self.listings += 1
        self.shown = frozenset(running_pod_ports(self.pods, "bootstrap"))
        return True

    def close(self) -> None: ...


def pod(ip: str, port: int, phase: str = "Running") -> dict[str, Any]:
    ports = [
        {"name": "http", "containerPort": DEFAULT_HTTP_PORT},
        {"name": "bootstrap", "containerPort": port},
    ]
    return {
        "metadata": {},
        "status": {"phase": phase, "podIP": ip},
        "spec": {"containers": [{"ports": ports}]},
    }


def test_the_deployments_prefill_pods_are_allowed_a_new_one_after_one_listing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [100.0]
    monkeypatch.setattr(allow_module.time, "monotonic", lambda: clock[0])
    pods = FakePods()
    pods.pods = [pod("10.1.0.5", 8998), pod("10.1.0.6", 8998, phase="Pending")]
    pods.refresh()
    allowed = PrefillAllow([], pods)

    async def main() -> None:
        assert await allowed.admit("10.1.0.5", 8998)
        assert not await allowed.admit("10.1.0.5", DEFAULT_HTTP_PORT)  # only the port it declares
        assert pods.listings == 2  # an unknown endpoint: the pods were listed once more
        pods.pods.append(pod("10.1.0.7", 8998))  # a prefill that just started
        assert not await allowed.admit("10.1.0.7", 8998)  # within MIN_REFRESH_S: no listing
        assert pods.listings == 2
        clock[0] += allow_module.MIN_REFRESH_S
        assert await allowed.admit("10.1.0.7", 8998)
        assert not await allowed.admit("10.1.0.6", 8998)  # not Running
        assert pods.listings == 3

    asyncio.run(main())


def test_the_router_does_not_tell_clients_what_its_workers_failed_with() -> None:
    from pdworker.discovery import StaticDiscovery
    from pdworker.router import Router

    port = closed_port()
    router = Router(StaticDiscovery([f"http://{HOST}:{port}"], [f"http://{HOST}:{port}"]), "r")

    async def main() -> tuple[int, dict[str, Any]]:
        await router.start()
        try:
            async with TestClient(TestServer(router.app(), host=HOST)) as client:
                resp = await client.post("/generate", json={"input_ids": [1, 2]})
                return resp.status, await resp.json()
        finally:
            await router.stop()

    status, answer = asyncio.run(main())
    assert status == 503 and answer["reason"] == "peer_lost", answer
    assert answer["error"] == "a prefill gave no bootstrap info"
