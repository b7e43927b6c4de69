"""The pair canary's "health" protocol (SGLang) against two local HTTP servers on 127.0.0.1.

They play an SGLang 0.5.23 prefill and decode: /health and /metrics (a series the SGLang table
reads as progress). SGLang's two PD legs wait on each other, so its canary asks both sides' own
/health at once: 200 is alive; SGLang's own 503 (its scheduler did not answer within
SGLANG_HEALTH_CHECK_TIMEOUT) or no answer in time is dead, but only while that pod's counters
stand still; anything else proves nothing. Beside the health checks, where the prefill's
bootstrap port is known, one PD request (SGLang's router protocol: the same body to both sides)
proves the KV path: decoded when both answer with a generation, else the pair is only alive.
What is pinned down: each outcome, which side is named, that both sides are always asked, that
a slow engine is never called dead, that the canary never raises.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from aiohttp import web

from pdwarden.engines.sglang import PAIR_CANARY
from pdwarden.remediation.confirm.pair_canary import PairCanarySender
from pdwarden.remediation.scrape.worker_client import WorkerClient
from pdwarden.values import PairResult, Target

ASKED = web.AppKey("asked", list[str])
BODIES = web.AppKey("bodies", list[Any])  # what /generate was sent
DONE = web.AppKey("done", list[float])  # sglang:num_requests_total, which /metrics shows
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def metrics(request: web.Request) -> web.Response:
    done = request.app[DONE][0]
    return web.Response(
        text=f'sglang:num_requests_total{{model_name="tiny",is_streaming="false"}} {done}\n'
    )


async def healthy(request: web.Request) -> web.Response:
    request.app[ASKED].append(request.path)
    return web.Response(status=200)


async def frozen(request: web.Request) -> web.Response:
    request.app[ASKED].append(request.path)
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


async def said_unhealthy(request: web.Request) -> web.Response:
    """SGLang's own verdict: no answer from its scheduler within the health check timeout."""
    request.app[ASKED].append(request.path)
    return web.Response(status=503)


async def slow(request: web.Request) -> web.Response:
    """A live engine busy with others' work: no answer in time, but its counters move."""
    request.app[ASKED].append(request.path)
    while True:
        request.app[DONE][0] += 1
        await asyncio.sleep(0.05)


async def broken(request: web.Request) -> web.Response:
    request.app[ASKED].append(request.path)
    return web.Response(status=500, text="<html>proxy error</html>")


async def generates(request: web.Request) -> web.Response:
    """SGLang's /generate answer (both legs answer once the KV moved)."""
    request.app[ASKED].append(request.path)
    request.app[BODIES].append(await request.json())
    return web.json_response({"text": "a", "output_ids": [5], "meta_info": {"id": "r"}})


async def garbage(request: web.Request) -> web.Response:
    request.app[ASKED].append(request.path)
    return web.json_response(["not", "a", "generation"])


@asynccontextmanager
async def pod(
    name: str, role: str, health: Handler, generate: Handler = frozen, bootstrap: int = 0
) -> AsyncIterator[tuple[Target, web.Application]]:
    app = web.Application()
    app[ASKED], app[DONE], app[BODIES] = [], [7.0], []
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/health", health)
    app.router.add_post("/generate", generate)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield Target(pod=name, uid=f"u-{name}", role=role, ip="127.0.0.1", port=port,
                     engine="sglang", bootstrap_port=bootstrap), app  # fmt: skip
    finally:
        await runner.cleanup()


def run(
    prefill: Handler, decode: Handler, deadline: float = 0.4, *, kv: Handler | None = None,
    kv_decode: Handler | None = None, bodies: list[Any] | None = None,
) -> tuple[PairResult, list[str], list[str]]:  # fmt: skip
    """One canary; with `kv`, the prefill's bootstrap port is known and both pods' /generate
    answer with `kv` (the decode's with `kv_decode` if given); `bodies` gets what they got."""
    bootstrap = 8998 if kv is not None else 0
    kv = kv or frozen

    async def go() -> tuple[PairResult, list[str], list[str]]:
        client = WorkerClient()
        try:
            async with (
                pod("p-0", "prefill", prefill, kv, bootstrap) as (pt, papp),
                pod("d-0", "decode", decode, kv_decode or kv) as (dt, dapp),
            ):
                sender = PairCanarySender(client, client)
                res = await sender.pair(pt, dt, PAIR_CANARY, "t", deadline)
                if bodies is not None:
                    bodies.extend(papp[BODIES] + dapp[BODIES])
                return res, papp[ASKED], dapp[ASKED]
        finally:
            await client.close()

    return asyncio.run(go())


def test_both_sides_answer_their_own_health_checks_alive_and_nothing_is_read_as_progress() -> None:
    res, to_prefill, to_decode = run(healthy, healthy)
    assert res.outcome == "alive" and res.prefill_answered and res.decode_answered
    assert res.prefill_sent and res.decode_sent
    assert to_prefill == to_decode == ["/health"]  # no bootstrap port known: no KV request
    assert "both answered" in res.detail and not res.kv_sent


def test_the_kv_request_goes_to_both_sides_as_sglangs_router_sends_it_and_proves_the_path() -> None:
    bodies: list[Any] = []
    res, to_prefill, to_decode = run(healthy, healthy, kv=generates, bodies=bodies)
    assert res.outcome == "decoded" and res.kv_sent, res
    assert "KV moved and a token decoded" in res.detail and "both answered" in res.detail
    assert sorted(to_prefill) == sorted(to_decode) == ["/generate", "/health"]
    first, second = bodies
    assert first == second  # one body: the decode finds the room the prefill serves
    assert (first["bootstrap_host"], first["bootstrap_port"]) == ("127.0.0.1", 8998)
    assert isinstance(first["bootstrap_room"], int) and 0 <= first["bootstrap_room"] < 2**63
    assert first["sampling_params"]["max_new_tokens"] == 1 and first["log_metrics"] is False
    # The health checks move only series never read as progress; the KV request, one transfer
    # observed by the prefill (measured on the real pair).
    assert PAIR_CANARY.effects == {"prefill": {"kv_transfers": 1}}


def test_a_kv_request_that_does_not_complete_leaves_the_pair_alive_and_says_so() -> None:
    """Both health checks answered, so no side is named; the detail says the KV did not move."""
    res, _, _ = run(healthy, healthy, kv=frozen)
    assert res.outcome == "alive" and res.kv_sent, res
    assert "its KV request got no answer from p-0 within 0.4s" in res.detail
    res, _, _ = run(healthy, healthy, kv=generates, kv_decode=garbage)
    assert res.outcome == "alive" and "not a generation" in res.detail, res
    res, _, _ = run(healthy, healthy, kv=generates, kv_decode=broken)
    assert res.outcome == "alive" and "HTTP 500" in res.detail, res


def test_a_frozen_side_is_named_by_its_health_check_whatever_the_kv_request_did() -> None:
    res, _, _ = run(frozen, healthy, kv=frozen)
    assert res.outcome == "prefill_dead" and res.kv_sent and res.decode_answered, res
    res, _, _ = run(healthy, said_unhealthy, kv=frozen)
    assert res.outcome == "decode_dead", res


def test_a_frozen_prefill_is_prefill_dead_and_the_decode_that_answered_says_so() -> None:
    res, _, to_decode = run(frozen, healthy)
    assert res.outcome == "prefill_dead", res
    assert not res.prefill_answered and res.decode_answered and to_decode == ["/health"]
    assert "no answer within 0.4s" in res.detail and "counters stand still" in res.detail


def test_sglangs_own_503_on_a_still_decode_is_decode_dead() -> None:
    res, _, _ = run(healthy, said_unhealthy)
    assert res.outcome == "decode_dead", res
    assert res.prefill_answered and not res.decode_answered
    assert "503, the engine's own verdict" in res.detail


def test_both_frozen_names_the_prefill() -> None:
    res, _, _ = run(frozen, frozen)
    assert res.outcome == "prefill_dead" and not res.prefill_answered and not res.decode_answered


def test_a_slow_engine_whose_counters_move_is_never_called_dead() -> None:
    res, _, _ = run(slow, healthy)
    assert res.outcome == "unknown" and "counters move" in res.detail


def test_answers_that_prove_nothing_are_unknown_and_unreachable_pods_never_raise() -> None:
    res, _, _ = run(healthy, broken)
    assert res.outcome == "unknown" and "HTTP 500" in res.detail

    async def go() -> PairResult:
        client = WorkerClient()
        try:
            gone = Target(pod="p-9", uid="u", role="prefill", ip="127.0.0.1", port=9,
                          engine="sglang")  # fmt: skip
            async with pod("d-0", "decode", healthy) as (dt, _):
                return await PairCanarySender(client, client).pair(gone, dt, PAIR_CANARY, "t", 0.4)
        finally:
            await client.close()

    res = asyncio.run(go())
    assert res.outcome == "unknown" and "p-9" in res.detail


def test_a_wait_for_a_connection_slot_is_never_read_as_a_silent_pod() -> None:
    """With every slot of its tenant busy, the canary proves nothing (unknown), however long
    the wait: the wait is ours, not the pod's."""

    async def go() -> PairResult:
        client = WorkerClient(connections_per_tenant=1, timeout=0.5)
        try:
            async with (
                pod("p-0", "prefill", healthy) as (pt, _papp),
                pod("d-0", "decode", healthy) as (dt, _dapp),
            ):
                await client.share("t").slots.acquire()
                try:
                    return await PairCanarySender(client, client).pair(
                        pt, dt, PAIR_CANARY, "t", 0.4
                    )
                finally:
                    client.share("t").slots.release()
        finally:
            await client.close()

    res = asyncio.run(go())
    assert res.outcome == "unknown" and "no connection slot" in res.detail, res
    assert not res.prefill_answered and not res.decode_answered
