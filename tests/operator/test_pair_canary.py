"""The pair canary (remediation.confirm.pair_canary) against two local HTTP servers on 127.0.0.1.

They play a vLLM 0.32 prefill and decode: /v1/models, /v1/completions and /metrics (the real
series names the vLLM table reads). The prefill answers the first leg with kv_transfer_params;
the decode must get exactly those back. A frozen engine accepts the leg and never answers; its
counters stand still, or move when it is only slow. Deadlines are short, so a dead outcome takes
a fraction of a second. What is pinned down: each outcome, that the decode leg carries the
prefill's params, that a slow engine is never called dead, that the canary never raises.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from aiohttp import web

from pdwarden.engines.vllm import PAIR_CANARY
from pdwarden.remediation.confirm.pair_canary import PairCanarySender
from pdwarden.remediation.scrape.worker_client import WorkerClient
from pdwarden.values import PairResult, Target

MODELS = {"object": "list", "data": [{"id": "tiny-llama", "object": "model"}]}
PARAMS = {"do_remote_prefill": True, "remote_engine_id": "e1", "remote_block_ids": [1, 2]}
ASKED = web.AppKey("asked", list[Any])
TOKENS = web.AppKey("tokens", list[float])  # the generation counter /metrics shows
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def models(_: web.Request) -> web.Response:
    return web.json_response(MODELS)


async def metrics(request: web.Request) -> web.Response:
    tokens = request.app[TOKENS][0]
    body = (
        f'vllm:generation_tokens_total{{engine="0",model_name="tiny-llama"}} {tokens}\n'
        f'vllm:prompt_tokens_total{{engine="0",model_name="tiny-llama"}} 40\n'
    )
    return web.Response(text=body)


def answer(extra: dict[str, Any]) -> Handler:
    async def handle(request: web.Request) -> web.Response:
        request.app[ASKED].append(await request.json())
        choice = {"index": 0, "text": "!", "finish_reason": "length"}
        return web.json_response({"choices": [choice], **extra})

    return handle


async def frozen(request: web.Request) -> web.Response:
    request.app[ASKED].append(await request.json())
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


async def slow(request: web.Request) -> web.Response:
    """A live engine busy with others' work: no answer in time, but its counters move."""
    request.app[ASKED].append(await request.json())
    while True:
        request.app[TOKENS][0] += 1
        await asyncio.sleep(0.05)


async def unauthorized(_: web.Request) -> web.Response:
    return web.json_response({"error": "Unauthorized"}, status=401)


@asynccontextmanager
async def pod(
    name: str, role: str, completion: Handler
) -> AsyncIterator[tuple[Target, web.Application]]:
    app = web.Application()
    app[ASKED], app[TOKENS] = [], [10.0]
    app.router.add_get("/v1/models", models)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/v1/completions", completion)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield Target(pod=name, uid=f"u-{name}", role=role, ip="127.0.0.1", port=port,
                     engine="vllm"), app  # fmt: skip
    finally:
        await runner.cleanup()


def run(
    prefill: Handler, decode: Handler, deadline: float = 0.4
) -> tuple[PairResult, list[Any], list[Any]]:
    async def go() -> tuple[PairResult, list[Any], list[Any]]:
        client = WorkerClient()
        try:
            async with (
                pod("p-0", "prefill", prefill) as (pt, papp),
                pod("d-0", "decode", decode) as (dt, dapp),
            ):
                sender = PairCanarySender(client, client)
                res = await sender.pair(pt, dt, PAIR_CANARY, "t", deadline)
                return res, papp[ASKED], dapp[ASKED]
        finally:
            await client.close()

    return asyncio.run(go())


PREFILL = answer({"kv_transfer_params": PARAMS})
DECODE = answer({})


def test_both_legs_answer_the_kv_moved_and_the_decode_got_the_prefills_params() -> None:
    res, to_prefill, to_decode = run(PREFILL, DECODE)
    assert res.outcome == "decoded" and res.prefill_answered and res.decode_answered
    assert res.prefill_sent and res.decode_sent
    assert res.seconds > 0 and "p-0 -> d-0" in res.detail
    [first] = to_prefill
    assert first["kv_transfer_params"]["do_remote_decode"] is True
    assert first["max_tokens"] == 1 and first["prompt"] == list(PAIR_CANARY.prompt)
    [second] = to_decode
    assert second["kv_transfer_params"] == PARAMS and second["prompt"] == first["prompt"]


def test_a_frozen_prefill_is_prefill_dead_and_the_decode_is_never_asked() -> None:
    res, _, to_decode = run(frozen, DECODE)
    assert (res.outcome, res.prefill, res.decode) == ("prefill_dead", "p-0", "d-0")
    assert "counters stand still" in res.detail and to_decode == []
    assert not res.prefill_answered and not res.decode_answered
    assert res.prefill_sent and not res.decode_sent  # it may still process the leg: owed


def test_a_frozen_decode_is_decode_dead_after_the_prefill_answered() -> None:
    res, _, to_decode = run(PREFILL, frozen)
    assert res.outcome == "decode_dead" and res.prefill_answered and not res.decode_answered
    assert res.prefill_sent and res.decode_sent and len(to_decode) == 1


def test_a_slow_engine_whose_counters_move_is_never_called_dead() -> None:
    res, _, _ = run(PREFILL, slow)
    assert res.outcome == "unknown" and "slow" in res.detail
    assert res.decode_sent and not res.decode_answered  # what it adds later is the canary's
    res, _, _ = run(slow, DECODE)
    assert res.outcome == "unknown"


def test_answers_that_prove_nothing_are_unknown() -> None:
    for prefill, decode, why in (
        (unauthorized, DECODE, "HTTP 401"),
        (answer({}), DECODE, "carries no kv_transfer_params"),
        (answer({"kv_transfer_params": "garbage"}), DECODE, "carries no kv_transfer_params"),
        (PREFILL, unauthorized, "HTTP 401"),
    ):
        res, _, _ = run(prefill, decode)
        assert res.outcome == "unknown" and why in res.detail, (why, res)


def test_an_unreachable_pod_is_unknown_and_nothing_raises() -> None:
    async def go() -> PairResult:
        client = WorkerClient()
        try:
            gone = Target(pod="p-0", uid="u", role="prefill", ip="127.0.0.1", port=1, engine="vllm")
            async with pod("d-0", "decode", DECODE) as (dt, _):
                return await PairCanarySender(client, client).pair(gone, dt, PAIR_CANARY, "t", 0.4)
        finally:
            await client.close()

    res = asyncio.run(go())
    assert res.outcome == "unknown" and not res.prefill_sent and not res.decode_sent
