"""The vLLM decode canary (remediation.confirm.canary) against a local HTTP server on 127.0.0.1.

The server plays the parts of a vLLM 0.32 API server: one whose engine answers, one whose engine
is frozen (GET /v1/models answers, the completion never does), one run with --api-key, and a
few that answer garbage or too much. Deadlines are passed short, so a dead verdict takes a
fraction of a second. What is pinned down: the verdict, that the canary never raises, that a
body is never read past its cap, and that a canary holds a slot of its own tenant's share only.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from aiohttp import web

from pdwarden.remediation.confirm.canary import MAX_ANSWER_BYTES, Canary
from pdwarden.remediation.scrape.worker_client import WorkerClient
from pdwarden.values import CanaryResult, Target

MODELS = {"object": "list", "data": [{"id": "tiny-llama", "object": "model"}, {"id": "lora"}]}
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
ASKED = web.AppKey("asked", list[Any])  # the completion requests the server received


async def models(_: web.Request) -> web.Response:
    return web.json_response(MODELS)


async def completion(request: web.Request) -> web.Response:
    asked = await request.json()
    request.app[ASKED].append(asked)
    choice = {"index": 0, "text": "!", "finish_reason": "length"}
    return web.json_response({"object": "text_completion", "choices": [choice]})


async def frozen(request: web.Request) -> web.Response:
    """An API server whose engine never produces the token: the request is accepted, no answer."""
    request.app[ASKED].append(await request.json())
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


async def unauthorized(_: web.Request) -> web.Response:
    return web.json_response({"error": "Unauthorized"}, status=401)


@asynccontextmanager
async def server(
    models_handler: Handler = models, completion_handler: Handler = completion
) -> AsyncIterator[tuple[Target, web.Application]]:
    app = web.Application()
    app[ASKED] = []
    app.router.add_get("/v1/models", models_handler)
    app.router.add_post("/v1/completions", completion_handler)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield Target(pod="d-0", uid="u", role="decode", ip="127.0.0.1", port=port,
                     engine="vllm"), app  # fmt: skip
    finally:
        await runner.cleanup()


async def probe(
    target: Target, deadline: float = 0.5, client: WorkerClient | None = None, tenant: str = "t"
) -> CanaryResult:
    client = client or WorkerClient()
    try:
        return await Canary(client, deadline=deadline, models_deadline=0.5).probe(target, tenant)
    finally:
        await client.close()


def test_a_live_engine_answers_one_token_for_the_first_model() -> None:
    async def main() -> tuple[CanaryResult, list[Any]]:
        async with server() as (target, app):
            return await probe(target), app[ASKED]

    result, asked = asyncio.run(main())
    assert (result.pod, result.verdict) == ("d-0", "alive")
    assert asked == [{"model": "tiny-llama", "prompt": "pdwarden canary", "max_tokens": 1}]


def test_a_frozen_engine_behind_a_live_api_server_is_dead_after_the_deadline() -> None:
    async def main() -> tuple[CanaryResult, float, list[Any]]:
        async with server(completion_handler=frozen) as (target, app):
            started = asyncio.get_running_loop().time()
            result = await probe(target, deadline=0.4)
            return result, asyncio.get_running_loop().time() - started, app[ASKED]

    result, took, asked = asyncio.run(main())
    assert result.verdict == "dead", result
    assert "no token within 0.4s" in result.detail and "/v1/models" in result.detail
    assert 0.4 <= took < 2.0 and len(asked) == 1  # the request reached the server


def test_a_server_run_with_an_api_key_is_unknown_never_dead() -> None:
    async def main() -> CanaryResult:
        async with server(models_handler=unauthorized, completion_handler=frozen) as (t, _):
            return await probe(t)

    result = asyncio.run(main())
    assert result.verdict == "unknown"
    assert "HTTP 401" in result.detail and "--api-key" in result.detail


def test_an_api_server_that_does_not_answer_the_model_list_is_unknown() -> None:
    """Not even /v1/models, which needs no engine: the server or the path to it is the problem."""

    async def hang(_: web.Request) -> web.Response:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async def main() -> CanaryResult:
        async with server(models_handler=hang) as (target, _):
            return await probe(target)

    result = asyncio.run(main())
    assert result.verdict == "unknown" and "no answer within 0.5s" in result.detail


def test_a_refused_connection_is_unknown() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed when the block ends: nothing listens there
    target = Target(pod="d-0", uid="u", role="decode", ip="127.0.0.1", port=port)
    result = asyncio.run(probe(target))
    assert result.verdict == "unknown" and "Client" in result.detail


def test_garbage_and_answers_without_a_choice_are_unknown() -> None:
    async def text(_: web.Request) -> web.Response:
        return web.Response(text="<html>proxy error</html>")

    async def empty(_: web.Request) -> web.Response:
        return web.json_response({"choices": []})

    async def no_model(_: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": ""}]})

    async def error(_: web.Request) -> web.Response:
        return web.json_response({"error": "engine dead"}, status=500)

    async def main() -> list[CanaryResult]:
        out = []
        for m, c in ((text, completion), (models, text), (models, empty), (no_model, completion),
                     (models, error)):  # fmt: skip
            async with server(m, c) as (target, _):
                out.append(await probe(target))
        return out

    results = asyncio.run(main())
    assert [r.verdict for r in results] == ["unknown"] * 5
    assert [r.detail for r in results] == [
        "GET /v1/models: answer is not JSON",
        "POST /v1/completions: answer is not JSON",
        "POST /v1/completions: answer without a choice",
        "GET /v1/models: no usable model id in the answer",
        "POST /v1/completions: HTTP 500",
    ]


def test_a_huge_answer_is_not_read_past_the_cap_and_is_unknown() -> None:
    sent: list[int] = []

    async def declared(_: web.Request) -> web.Response:
        return web.Response(body=b"[" * (4 * MAX_ANSWER_BYTES), content_type="application/json")

    async def endless(request: web.Request) -> web.StreamResponse:
        """No Content-Length, chunk after chunk: only the reader's cap stops it."""
        resp = web.StreamResponse()
        await resp.prepare(request)
        chunk = json.dumps({"choices": [{"text": "x" * 1000}]}).encode() * 16
        for _ in range(4096):  # 64 MiB if nobody stopped reading
            await resp.write(chunk)
            sent.append(len(chunk))
        return resp

    async def main() -> list[CanaryResult]:
        out = []
        for c in (declared, endless):
            async with server(completion_handler=c) as (target, _):
                out.append(await probe(target, deadline=5.0))
        return out

    results = asyncio.run(main())
    assert [r.verdict for r in results] == ["unknown", "unknown"]
    assert all(f"over the {MAX_ANSWER_BYTES}-byte cap" in r.detail for r in results)
    assert sum(sent) < 64 * MAX_ANSWER_BYTES  # the server was stopped, not read to its end


def test_a_canary_holds_its_own_tenants_slot_only() -> None:
    """With every slot of tenant a busy, a canary for a is unknown (it never waited for the
    engine); one for tenant b, in its own share, is answered."""

    async def main() -> tuple[CanaryResult, CanaryResult]:
        client = WorkerClient(connections_per_tenant=1)
        async with server() as (target, _):
            await client.share("a").slots.acquire()
            try:
                starved = await Canary(client, 0.3, models_deadline=0.3).probe(target, "a")
                other = await Canary(client, 0.3, models_deadline=0.3).probe(target, "b")
            finally:
                client.share("a").slots.release()
                await client.close()
        return starved, other

    starved, other = asyncio.run(main())
    assert starved.verdict == "unknown" and "no connection slot" in starved.detail
    assert other.verdict == "alive"


def test_the_slot_is_given_back_whatever_the_verdict() -> None:
    async def main() -> list[str]:
        client = WorkerClient(connections_per_tenant=1)
        verdicts = []
        try:
            for m, c in ((models, frozen), (unauthorized, completion), (models, completion)):
                async with server(m, c) as (target, _):
                    res = await Canary(client, deadline=0.3, models_deadline=0.3).probe(target)
                    verdicts.append(res.verdict)
            assert not client.share("").slots.locked()
        finally:
            await client.close()
        return verdicts

    assert asyncio.run(main()) == ["dead", "unknown", "alive"]
