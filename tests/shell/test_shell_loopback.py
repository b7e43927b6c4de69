"""The client errors of issue 13 item 4, produced by real servers on loopback, contained.

A real `WorkerClient` talks HTTP to real aiohttp servers (one per pod, each on its own loopback
address, as the local kubelet gives pods) that misbehave the way a hostile or broken worker can:
a fail-rooms answer that is not JSON (aiohttp `ContentTypeError`), a connection closed without
an answer (`ServerDisconnectedError`), rooms JSON nested deeper than the parser's recursion
limit (`RecursionError`). A real `KubeClient` meets an API server that is down (urllib3
`MaxRetryError`). Each is contained where it happens and the rest of the cycle goes on.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from typing import Any

import pytest
from aiohttp import web
from kubernetes import client as k8s
from prometheus_client import REGISTRY
from shell_fakes import KubeFake, cluster

from pdwarden.constants import KIND
from pdwarden.handlers.on_deployment import OperatorState, remediation_cycle
from pdwarden.k8s import ApiError, KubeClient
from pdwarden.remediation.act.worker_admin import WorkerAdmin
from pdwarden.remediation.scrape.worker_client import WorkerClient
from pdwarden.values import ScrapeResult, Target
from pdworker import contract

KEY = b"k" * 32
METRICS = (
    f"# TYPE {contract.PREFILL_INFLIGHT_QUEUE} gauge\n{contract.PREFILL_INFLIGHT_QUEUE} 1\n"
    f"# TYPE {contract.DECODE_RUNNING} gauge\n{contract.DECODE_RUNNING} 0\n"
)


def rooms(room: int, peer: str) -> list[dict[str, Any]]:
    return [{"room": room, "role": "prefill", "state": "Transferring", "phase": "inflight",
             "phase_seconds": 30.0, "age_seconds": 31.0,
             "peer": {"pod": peer, "address": "x", "incarnation": f"inc-{peer}"}}]  # fmt: skip


class PortMap:
    """The real WorkerClient and WorkerAdmin, with each pod's address mapped to its test
    server's port (the operator always dials the worker port; test servers cannot all have it)."""

    def __init__(self, inner: WorkerClient, ports: dict[str, int]) -> None:
        self.inner, self.admin, self.ports = inner, WorkerAdmin(), ports

    def _map(self, t: Target) -> Target:
        return replace(t, port=self.ports[t.ip])

    async def scrape(
        self, targets: Sequence[Target], token: str | None, tenant: str = ""
    ) -> list[ScrapeResult]:
        return await self.inner.scrape([self._map(t) for t in targets], token, tenant)

    async def fail_rooms(self, target: Target, rooms: Sequence[int], token: str | None) -> int:
        return await self.admin.fail_rooms(self._map(target), rooms, token)

    def forget(self, tenant: str) -> None:
        self.inner.forget(tenant)

    async def close(self) -> None:
        await self.inner.close()
        await self.admin.close()


def worker_app(behaviour: str, room: int) -> web.Application:
    failed: list[int] = []

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=METRICS)

    async def admin_rooms(_: web.Request) -> web.Response:
        if behaviour == "nested":
            return web.Response(text="[" * 200_000 + "]" * 200_000, content_type="application/json")
        live = [] if room in failed else rooms(room, "pd-decode-1")
        return web.json_response({"rooms": live})

    async def fail(request: web.Request) -> web.StreamResponse:
        if behaviour == "html":
            return web.Response(text="<html>oops</html>", content_type="text/html")
        if behaviour == "disconnect":
            assert request.transport is not None
            request.transport.close()
            raise asyncio.CancelledError
        failed.extend((await request.json())["rooms"])
        return web.json_response({"failed": failed})

    app = web.Application()
    app.router.add_get(contract.METRICS_PATH, metrics)
    app.router.add_get(contract.ADMIN_ROOMS_PATH, admin_rooms)
    app.router.add_post(contract.ADMIN_ROOMS_FAIL_PATH, fail)
    return app


async def serve(behaviours: dict[str, str]) -> AsyncIterator[dict[str, int]]:
    runners, ports = [], {}
    for i, (ip, behaviour) in enumerate(behaviours.items()):
        runner = web.AppRunner(worker_app(behaviour, room=10 + i))
        await runner.setup()
        site = web.TCPSite(runner, ip, 0)
        await site.start()
        ports[ip] = runner.addresses[0][1]
        runners.append(runner)
    try:
        yield ports
    finally:
        for runner in runners:
            await runner.cleanup()


def ledger(kube: KubeFake) -> list[tuple[str, str]]:
    rem = (kube.obj(KIND, "ns", "pd").get("status") or {}).get("remediation") or {}
    return sorted((e["pod"], e.get("outcome", "Succeeded")) for e in rem.get("history") or [])


@pytest.mark.parametrize(
    ("bad", "expect", "why"),
    [
        ("html", [("pd-prefill-0", "Failed"), ("pd-prefill-1", "Succeeded")], "not JSON"),
        ("disconnect", [("pd-prefill-0", "Failed"), ("pd-prefill-1", "Succeeded")], "disconnect"),
        # pd-prefill-0 cannot be judged (an unusable rooms answer is a scrape error): no action
        ("nested", [("pd-prefill-1", "Succeeded")], None),
    ],
)
def test_a_misbehaving_worker_costs_only_its_own_action(
    bad: str, expect: list[tuple[str, str]], why: str | None
) -> None:
    scrape_errors = scrape_failures()
    kube = KubeFake()
    cluster(kube, prefill=2, decode=2)

    async def main() -> None:
        agen = serve({"127.0.1.1": bad, "127.0.1.2": "ok", "127.0.2.1": "ok", "127.0.2.2": "ok"})
        ports = await agen.__anext__()
        try:
            workers = PortMap(WorkerClient(timeout=5.0), ports)
            state = OperatorState(client=kube, workers=workers, admin=workers, token_key=KEY)
            await remediation_cycle(state, kube.obj(KIND, "ns", "pd"))
            await workers.close()
        finally:
            await agen.aclose()

    asyncio.run(main())
    assert ledger(kube) == expect
    status = kube.obj(KIND, "ns", "pd")["status"]
    said = json.dumps([status["remediation"]["history"], status["conditions"]])
    if why is not None:
        assert why in said
    if why is None:  # the unusable answer is a failed scrape, counted as one
        assert scrape_failures() == scrape_errors + 1


def scrape_failures() -> float:
    return REGISTRY.get_sample_value("pdwarden_scrape_errors_total") or 0.0


def errors(stage: str) -> float:
    return REGISTRY.get_sample_value("pdwarden_operator_errors_total", {"stage": stage}) or 0.0


def test_an_api_server_that_is_down_reads_as_unreachable_not_a_crash() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    config = k8s.Configuration(host=f"http://127.0.0.1:{port}")
    config.retries = 1
    client = KubeClient(k8s.ApiClient(config), timeout=3.0)
    with pytest.raises(ApiError) as caught:
        asyncio.run(client.list("v1", "Pod", "ns", "a=b"))
    assert caught.value.status == 0 and caught.value.transient
    assert "MaxRetryError" in str(caught.value) or "Connection" in str(caught.value)
