"""Fuzz the worker's edges in-process: bootstrap, admin and /generate never answer 500, never
buffer an unbounded body, and never act before a request is fully validated.

The apps are the real ones (`BootstrapServer`, `worker_app`, the role handlers) served by aiohttp
on 127.0.0.1; only the KV transport is a recording stand-in (`transfer.Transport` is the seam),
so a test can see whether NIXL would have been handed anything. Real NIXL and real processes are
in test_trust_attacks.py.
"""

from __future__ import annotations

import asyncio
import base64
import json
import struct
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import torch
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pdworker import limits
from pdworker.bootstrap import BootstrapServer
from pdworker.config import WorkerConfig
from pdworker.decode import DecodeWorker
from pdworker.discovery import StaticDiscovery
from pdworker.handshake import NIXL_METADATA_TAG
from pdworker.model import KVPool, ModelConfig, TinyModel
from pdworker.prefill import PrefillWorker
from pdworker.router import Router
from pdworker.server import worker_app
from pdworker.transfer import TransferError

KEY = "fuzz-bootstrap-key"
ADMIN = "fuzz-admin-token"
MODEL = ModelConfig(layers=1, heads=1, head_dim=8, page_size=4, vocab=64)
OK_CODES = {200, 400, 401, 403, 404, 409, 410, 413, 429, 503}


class RecordingTransport:
    """Stands in for NixlTransport: records what NIXL would have been given."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.added: list[str] = []

    def metadata(self) -> bytes:
        return nixl_metadata(self.name)

    def add_peer(self, agent: str, metadata: bytes, descs: list[Any], mem_type: str) -> None:
        if b"refuse" in metadata:
            raise TransferError("NIXL refused the metadata")
        self.added.append(agent)

    def remove_peer(self, agent: str) -> None: ...

    def write(self, *args: Any) -> None: ...

    def notify(self, agent: str, message: bytes) -> None: ...

    def poll_notifs(self) -> dict[str, list[bytes]]:
        return {}

    def close(self) -> None: ...


def nixl_metadata(agent: str, tail: bytes = b"|Conns...") -> bytes:
    name = agent.encode()
    return NIXL_METADATA_TAG + struct.pack("<Q", len(name)) + name + tail


def prefill_worker(**cfg: Any) -> PrefillWorker:
    config = WorkerConfig(role="prefill", pod="p0", model=MODEL, kv_pages=64, **cfg)
    device = torch.device("cpu")
    return PrefillWorker(
        config,
        TinyModel(MODEL, device),
        KVPool(MODEL, 64, device),
        RecordingTransport("prefill-a"),  # type: ignore[arg-type]
    )


def registration(agent: str = "decode-a", address: str = "127.0.0.1:9000") -> dict[str, Any]:
    return {
        "agent": agent,
        "pod": "decode-0",
        "address": address,
        "incarnation": agent,
        "metadata": base64.b64encode(nixl_metadata(agent)).decode(),
        "layout": MODEL.layout(),
        "pool": {
            "base_addr": 1 << 20,
            "page_bytes": MODEL.page_bytes,
            "num_pages": 64,
            "device_id": 0,
            "mem_type": "DRAM",
        },
    }


def run(coro_fn: Callable[[TestClient], Awaitable[None]], app: web.Application) -> None:
    async def main() -> None:
        async with TestClient(TestServer(app, host="127.0.0.1")) as client:
            await coro_fn(client)

    asyncio.run(main())


def auth(token: str = KEY) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
    | st.sampled_from(["²", "١٢", "-1", " 5", "1e3", "0x10", "9" * 25]),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


@st.composite
def mutated_registration(draw: st.DrawFn) -> Any:
    body = registration()
    choice = draw(st.integers(0, 3))
    if choice == 0:
        return draw(json_values)
    key = draw(st.sampled_from([*body, "pool.num_pages", "pool.base_addr", "pool.mem_type"]))
    value = draw(json_values)
    if key.startswith("pool."):
        body["pool"][key[5:]] = value
    elif choice == 1:
        body.pop(key)
    else:
        body[key] = value
    return body


FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))


@FUZZ
@given(st.lists(mutated_registration(), min_size=1, max_size=8))
def test_bootstrap_peer_fuzz_never_500_and_no_effect_before_validation(bodies: list[Any]) -> None:
    w = prefill_worker()
    transport: RecordingTransport = w.transport  # type: ignore[assignment]

    async def check(client: TestClient) -> None:
        for body in bodies:
            before = (list(transport.added), dict(w.peers))
            resp = await client.post("/bootstrap/peer", json=body, headers=auth())
            assert resp.status in OK_CODES, (resp.status, await resp.text(), body)
            if resp.status != 200:
                assert (transport.added, w.peers) == before, body

    run(check, BootstrapServer(w, KEY).app())


@FUZZ
@given(
    st.sampled_from(["/bootstrap/room", "/bootstrap/abort", "/bootstrap/heartbeat"]),
    st.lists(
        json_values
        | st.fixed_dictionaries(
            {"agent": st.sampled_from(["decode-a", "nobody", "", "x" * 300]) | json_values},
            optional={"room": json_values, "pages": json_values | st.lists(st.integers())},
        ),
        min_size=1,
        max_size=8,
    ),
)
def test_bootstrap_room_abort_heartbeat_fuzz(path: str, bodies: list[Any]) -> None:
    w = prefill_worker()

    async def check(client: TestClient) -> None:
        resp = await client.post("/bootstrap/peer", json=registration(), headers=auth())
        assert resp.status == 200
        for body in bodies:
            before = (dict(w.pending_bindings), dict(w.bindings), len(w.table))
            resp = await client.post(path, json=body, headers=auth())
            assert resp.status in OK_CODES, (resp.status, await resp.text(), body)
            if resp.status != 200:
                assert (dict(w.pending_bindings), dict(w.bindings), len(w.table)) == before

    run(check, BootstrapServer(w, KEY).app())


def test_bootstrap_refuses_without_the_key_and_with_no_key_configured() -> None:
    w = prefill_worker()
    transport: RecordingTransport = w.transport  # type: ignore[assignment]

    async def check(client: TestClient) -> None:
        for headers in ({}, auth("wrong"), {"Authorization": KEY}):
            resp = await client.post("/bootstrap/peer", json=registration(), headers=headers)
            assert resp.status == 401
        info = await (await client.get("/bootstrap/info?nonce=abc")).json()
        assert "proof" in info and info["agent"] == "prefill-a"

    run(check, BootstrapServer(w, KEY).app())

    async def disabled(client: TestClient) -> None:
        resp = await client.post("/bootstrap/peer", json=registration(), headers=auth())
        assert resp.status == 403
        assert "no bootstrap token" in (await resp.json())["error"]
        info = await (await client.get("/bootstrap/info?nonce=abc")).json()
        assert "proof" not in info

    run(disabled, BootstrapServer(w, None).app())
    assert transport.added == [] and w.peers == {}


def test_garbage_metadata_never_replaces_a_live_peer() -> None:
    w = prefill_worker()
    transport: RecordingTransport = w.transport  # type: ignore[assignment]

    async def check(client: TestClient) -> None:
        assert (
            await client.post("/bootstrap/peer", json=registration(), headers=auth())
        ).status == 200
        evil = registration("decode-evil")
        for metadata in (
            b"garbage",
            nixl_metadata("decode-a"),
            nixl_metadata("decode-evil", b"refuse"),
        ):
            evil["metadata"] = base64.b64encode(metadata).decode()
            resp = await client.post("/bootstrap/peer", json=evil, headers=auth())
            assert resp.status == 400, await resp.text()
        assert set(w.peers) == {"decode-a"} and not w.peers["decode-a"].dead
        # A real new incarnation at the same address does replace the old one, after loading.
        resp = await client.post("/bootstrap/peer", json=registration("decode-b"), headers=auth())
        assert resp.status == 200
        assert w.peers["decode-a"].dead and not w.peers["decode-b"].dead

    run(check, BootstrapServer(w, KEY).app())
    assert transport.added == ["decode-a", "decode-b"]


def test_peer_address_must_be_the_callers_and_pages_are_capped() -> None:
    w = prefill_worker()

    async def check(client: TestClient) -> None:
        resp = await client.post(
            "/bootstrap/peer", json=registration(address="127.0.0.9:9000"), headers=auth()
        )
        assert resp.status == 403 and "caller" in (await resp.json())["error"]
        for pages in (2**40, limits.MAX_PEER_PAGES + 1, 0, -1):
            body = registration()
            body["pool"]["num_pages"] = pages
            assert (await client.post("/bootstrap/peer", json=body, headers=auth())).status == 400
        big = b'{"agent": "' + b"x" * limits.BOOTSTRAP_PEER_BODY_BYTES + b'"}'
        resp = await client.post("/bootstrap/peer", data=big, headers=auth())
        assert resp.status == 413
        assert w.peers == {}

    run(check, BootstrapServer(w, KEY).app())


def test_rooms_first_bind_wins_and_only_the_owner_aborts() -> None:
    w = prefill_worker()

    async def check(client: TestClient) -> None:
        for agent in ("decode-a", "decode-b"):
            reg = registration(agent, address=f"127.0.0.1:{9000 if agent == 'decode-a' else 9001}")
            assert (await client.post("/bootstrap/peer", json=reg, headers=auth())).status == 200
        room = {"room": 7, "agent": "decode-a", "pages": [0]}
        resp = await client.post("/bootstrap/room", json=room, headers=auth())
        assert (await resp.json())["accepted"] == "pending"
        stranger = {**room, "agent": "decode-b", "pages": [1]}
        resp = await client.post("/bootstrap/room", json=stranger, headers=auth())
        assert resp.status == 409
        assert w.pending_bindings[7].agent == "decode-a" and w.pending_bindings[7].pages == [0]
        resp = await client.post(
            "/bootstrap/abort", json={"room": 7, "agent": "decode-b"}, headers=auth()
        )
        assert resp.status == 404 and 7 in w.pending_bindings
        resp = await client.post(
            "/bootstrap/abort", json={"room": 7, "agent": "decode-a"}, headers=auth()
        )
        assert resp.status == 200 and 7 not in w.pending_bindings

    run(check, BootstrapServer(w, KEY).app())


def admin_app(target: Any) -> web.Application:
    return worker_app(render_metrics=lambda: b"", ready=lambda: True, admin=target, token=ADMIN)


nasty = st.sampled_from(["²", "١٢", "-1", " 5", "1e3", "0x10", "9" * 25, "", "0"])
admin_bodies = (
    st.fixed_dictionaries(
        {},
        optional={
            "rooms": st.lists(nasty, min_size=1, max_size=3) | st.lists(json_values) | json_values,
            "older_than_seconds": json_values,
            "peer_incarnation": json_values,
        },
    )
    | json_values
)


@FUZZ
@given(st.lists(admin_bodies, min_size=1, max_size=8))
def test_admin_fail_fuzz_never_500(bodies: list[Any]) -> None:
    w = prefill_worker()

    async def check(client: TestClient) -> None:
        for body in bodies:
            resp = await client.post("/admin/rooms/fail", json=body, headers=auth(ADMIN))
            assert resp.status in OK_CODES, (resp.status, await resp.text(), body)

    run(check, admin_app(w))


def test_parse_room_and_json_bombs_are_400_and_bodies_capped() -> None:
    w = prefill_worker()

    async def check(client: TestClient) -> None:
        for rooms in (["²"], ["١٢"], ["9" * 40], [2**63]):
            resp = await client.post(
                "/admin/rooms/fail", json={"rooms": rooms}, headers=auth(ADMIN)
            )
            assert resp.status == 400, (rooms, await resp.text())
        for raw in (b"[" * 100_000, b'{"rooms": [' + b"9" * 5000 + b"]}"):
            resp = await client.post("/admin/rooms/fail", data=raw, headers=auth(ADMIN))
            assert resp.status == 400, await resp.text()
        resp = await client.post(
            "/admin/rooms/fail", data=b" " * (limits.ADMIN_BODY_BYTES + 1), headers=auth(ADMIN)
        )
        assert resp.status == 413

    run(check, admin_app(w))


generate_bodies = (
    st.fixed_dictionaries(
        {},
        optional={
            "bootstrap_room": nasty | json_values,
            "input_ids": json_values | st.lists(st.integers(-5, 2**40), max_size=5),
            "max_new_tokens": json_values,
            "bootstrap_host": json_values
            | st.sampled_from(["127.0.0.1", "localhost", "example.com", "::1", "10.0.0.1"]),
            "bootstrap_port": json_values | st.integers(-1, 70000),
        },
    )
    | json_values
)


@FUZZ
@given(st.lists(generate_bodies, min_size=1, max_size=8))
def test_generate_fuzz_never_500_before_any_room_exists(bodies: list[Any]) -> None:
    # Stopping workers answer 503 right after validation, so a valid body leaves nothing behind.
    p = prefill_worker()
    p.stopping = True
    cfg = WorkerConfig(role="decode", pod="d0", model=MODEL, bootstrap_token=KEY)
    device = torch.device("cpu")
    d = DecodeWorker(
        cfg, TinyModel(MODEL, device), KVPool(MODEL, 16, device), RecordingTransport("d")
    )  # type: ignore[arg-type]
    d.stopping = True
    app = web.Application()
    app.router.add_post("/prefill", p.handle_generate)
    app.router.add_post("/decode", d.handle_generate)

    async def check(client: TestClient) -> None:
        for body in bodies:
            for path in ("/prefill", "/decode"):
                resp = await client.post(path, data=json.dumps(body))
                assert resp.status in OK_CODES, (path, resp.status, await resp.text(), body)
        assert len(p.table) == 0 and len(d.table) == 0 and not d.links.links

    run(check, app)


@pytest.mark.parametrize("host", ["example.com", "localhost", "http://127.0.0.1", "1.2.3"])
def test_decode_refuses_bootstrap_hosts_that_are_not_ip_literals(host: str) -> None:
    cfg = WorkerConfig(role="decode", pod="d0", model=MODEL, bootstrap_token=KEY)
    device = torch.device("cpu")
    d = DecodeWorker(
        cfg, TinyModel(MODEL, device), KVPool(MODEL, 16, device), RecordingTransport("d")
    )  # type: ignore[arg-type]
    app = web.Application()
    app.router.add_post("/generate", d.handle_generate)
    body = {"bootstrap_room": 1, "input_ids": [1], "bootstrap_host": host, "bootstrap_port": 8998}

    async def check(client: TestClient) -> None:
        resp = await client.post("/generate", json=body)
        assert resp.status == 400, await resp.text()
        assert len(d.table) == 0 and not d.links.links

    run(check, app)


@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(generate_bodies | st.fixed_dictionaries({"text": json_values}), max_size=6))
def test_router_generate_fuzz_never_500(bodies: list[Any]) -> None:
    # Nothing listens on port 1: a valid body ends in a clear 503, never a 500.
    router = Router(StaticDiscovery(["http://127.0.0.1:1"], ["http://127.0.0.1:1"]), "router-fuzz")

    async def check(client: TestClient) -> None:
        await router.start()
        try:
            for body in bodies:
                resp = await client.post("/generate", data=json.dumps(body))
                assert resp.status in OK_CODES, (resp.status, await resp.text(), body)
        finally:
            await router.stop()

    run(check, router.app())


def test_router_body_cap_is_413() -> None:
    router = Router(StaticDiscovery(["http://127.0.0.1:1"], ["http://127.0.0.1:1"]), "router-cap")

    async def check(client: TestClient) -> None:
        big = b'{"text": "' + b"a" * limits.GENERATE_BODY_BYTES + b'"}'
        assert (await client.post("/generate", data=big)).status == 413

    run(check, router.app())
