"""The router's vLLM mode builds vLLM's two PD legs from one OpenAI request.

The legs were checked against real vLLM 0.32 pods in e2e/tests/test_vllm_pair.py; here: what
each leg carries, that a prefill without a KV connector is a clear error, not a decode that
silently recomputes, and (against fake vLLM servers on loopback) what a client that leaves
mid-request costs the prefill: once the prefill has answered, it holds the KV until a decode
reads it, so the decode leg must reach the decode's engine even when the client is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from pdworker.discovery import StaticDiscovery
from pdworker.listen import start_guarded
from pdworker.server import BadRequest, wait_until
from pdworker.vllm_router import VllmRouter, decode_request, prefill_request

CHAT = {
    "model": "tiny",
    "messages": [{"role": "user", "content": "hi"}],
    "max_completion_tokens": 64,
    "stream": True,
    "stream_options": {"include_usage": True},
}


def test_prefill_leg_asks_for_one_token_kept_for_a_remote_decode() -> None:
    leg = prefill_request(CHAT)
    assert leg["kv_transfer_params"]["do_remote_decode"] is True
    assert leg["kv_transfer_params"]["do_remote_prefill"] is False
    assert leg["max_tokens"] == 1 and leg["max_completion_tokens"] == 1
    assert leg["stream"] is False and "stream_options" not in leg
    assert leg["messages"] == CHAT["messages"]
    assert CHAT["stream"] is True and "kv_transfer_params" not in CHAT  # the original is intact


def test_decode_leg_is_the_original_request_with_prefills_params() -> None:
    params = {"do_remote_prefill": True, "remote_engine_id": "e1", "remote_block_ids": [[1]],
              "remote_host": "10.0.0.7", "remote_port": 5600}  # fmt: skip
    leg = decode_request(CHAT, {"kv_transfer_params": params})
    assert leg["kv_transfer_params"] == params
    assert leg["max_completion_tokens"] == 64 and leg["stream"] is True


@pytest.mark.parametrize("answer", [{}, {"kv_transfer_params": None}, {"kv_transfer_params": {}}])
def test_a_prefill_without_kv_connector_is_refused(answer: dict[str, object]) -> None:
    with pytest.raises(BadRequest, match="kv_transfer_params"):
        decode_request(CHAT, answer)


HOST = "127.0.0.1"
PARAMS = {"do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": "e1",
          "remote_block_ids": [[1, 2]], "remote_request_id": "cmpl-p-1",
          "remote_host": "10.0.0.7", "remote_port": 5600}  # fmt: skip


@dataclass
class FakeVllm:
    """A prefill and a decode answering vLLM's PD protocol, and what their engines saw.

    Like vLLM's API server, the fake decode spends `tokenize_s` before its engine has the
    request, and a connection closed by then never reaches the engine (both run with handler
    cancellation: a closed connection aborts the handler, as vLLM aborts the request)."""

    tokenize_s: float = 0.3
    prefill_held: bool = False  # the prefill computes until `prefill_go` is set
    prefill_go: asyncio.Event = field(default_factory=asyncio.Event)
    prefill_hangs: bool = False
    decode_hangs: bool = False  # the engine has the request but never answers
    prefill_entered: asyncio.Event = field(default_factory=asyncio.Event)
    prefill_aborted: asyncio.Event = field(default_factory=asyncio.Event)
    decode_entered: asyncio.Event = field(default_factory=asyncio.Event)
    engine: list[dict[str, Any]] = field(default_factory=list)  # decode legs the engine got
    ended: list[tuple[str, str, float]] = field(default_factory=list)  # (prompt, how, when)

    async def prefill(self, request: web.Request) -> web.Response:
        await request.json()
        self.prefill_entered.set()
        try:
            if self.prefill_hangs:
                await asyncio.Event().wait()
            if self.prefill_held:
                await self.prefill_go.wait()
        except asyncio.CancelledError:
            self.prefill_aborted.set()
            raise
        return web.json_response({"choices": [{"text": "a"}], "kv_transfer_params": PARAMS})

    async def decode(self, request: web.Request) -> web.StreamResponse:
        self.decode_entered.set()
        prompt = "?"
        try:
            await asyncio.sleep(self.tokenize_s)
            body = await request.json()
            prompt = body["prompt"]
            self.engine.append(body)  # from here vLLM reads the KV, or frees it when aborted
            if self.decode_hangs:
                await asyncio.Event().wait()
            if not body.get("stream"):
                self._end(prompt, "done")
                return web.json_response({"choices": [{"text": "xyz"}]})
            out = web.StreamResponse()
            out.content_type = "text/event-stream"
            await out.prepare(request)
            for i in range(body["max_tokens"]):
                await out.write(f"data: {i}\n\n".encode())
                await asyncio.sleep(0.02)
            await out.write(b"data: [DONE]\n\n")
            await out.write_eof()
            self._end(prompt, "done")
            return out
        except asyncio.CancelledError:
            self._end(prompt, "aborted")
            raise

    def _end(self, prompt: str, how: str) -> None:
        self.ended.append((prompt, how, asyncio.get_running_loop().time()))


@contextlib.asynccontextmanager
async def _served(app: web.Application) -> AsyncIterator[str]:
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, HOST, 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://{HOST}:{port}"
    finally:
        await runner.cleanup()


def _app(route: str, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> Any:
    app = web.Application()
    app.router.add_post(route, handler)
    return app


Scenario = Callable[[FakeVllm, VllmRouter, str], Awaitable[None]]


def run(fake: Callable[[], FakeVllm], scenario: Scenario, **router: Any) -> None:
    """The fakes, the router (served as `pdworker router` serves it) and a scenario."""

    async def main() -> None:
        vllm = fake()
        async with (
            _served(_app("/v1/completions", vllm.prefill)) as prefill,
            _served(_app("/v1/completions", vllm.decode)) as decode,
        ):
            r = VllmRouter(StaticDiscovery([prefill], [decode]), "inc-1")
            for k, v in router.items():
                setattr(r, k, v)
            await r.start()
            port = _free_port()
            runner, _ = await start_guarded(r.app(), HOST, port, cap=64, refused=lambda _: None)
            try:
                await asyncio.wait_for(scenario(vllm, r, f"http://{HOST}:{port}"), 30)
            finally:
                await asyncio.wait_for(r.stop(), 10)  # nothing the router started hangs
                await runner.cleanup()

    asyncio.run(main())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


async def _post(url: str, body: dict[str, Any]) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as session, session.post(url, json=body) as resp:
        return resp.status, await resp.read()


def _ask(prompt: str, *, stream: bool, max_tokens: int) -> dict[str, Any]:
    return {"model": "tiny", "prompt": prompt, "stream": stream, "max_tokens": max_tokens}


def _client(router: str, body: dict[str, Any]) -> asyncio.Task[tuple[int, bytes]]:
    """A client request in flight; cancelling it closes its connection (the client leaves)."""
    return asyncio.create_task(_post(router + "/v1/completions", body))


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_a_request_crosses_prefill_and_decode(stream: bool) -> None:
    async def scenario(vllm: FakeVllm, _: VllmRouter, router: str) -> None:
        status, body = await _post(
            router + "/v1/completions", _ask("p", stream=stream, max_tokens=3)
        )
        assert status == 200
        assert body == (b"data: 0\n\ndata: 1\n\ndata: 2\n\ndata: [DONE]\n\n" if stream
                        else b'{"choices": [{"text": "xyz"}]}')  # fmt: skip
        (leg,) = vllm.engine
        assert leg["kv_transfer_params"] == PARAMS and leg["max_tokens"] == 3

    run(lambda: FakeVllm(tokenize_s=0.0), scenario)


def test_a_client_that_leaves_between_the_legs_still_gets_the_kv_read_and_released() -> None:
    """Measured on the real pair: clients that left after the prefill answered kept the prefill
    busy for 145 s (each request's blocks held for the whole lease). The decode leg must reach
    the decode's engine, which then reads the KV (the prefill frees it), and is then closed: a
    1000-token generation nobody reads is aborted after its first token."""

    async def scenario(vllm: FakeVllm, r: VllmRouter, router: str) -> None:
        client = _client(router, _ask("gone", stream=True, max_tokens=1000))
        await asyncio.wait_for(vllm.decode_entered.wait(), 10)
        client.cancel()  # the client goes while the decode's API server still tokenizes
        assert await wait_until(lambda: bool(vllm.engine), 10), "the decode never got the leg"
        assert vllm.engine[0]["kv_transfer_params"] == PARAMS
        assert await wait_until(lambda: bool(vllm.ended), 10)
        assert [(p, how) for p, how, _ in vllm.ended] == [("gone", "aborted")]
        assert await wait_until(lambda: not r.releases, 5)

    run(FakeVllm, scenario)


def test_a_client_that_leaves_before_the_prefill_answers_still_gets_the_kv_read_and_released(
) -> None:  # fmt: skip
    """Closing the prefill leg aborts the request in vLLM only while its engine runs it; one
    that finished while its answer was on the way keeps its blocks for the whole lease
    (measured on the real pair: 62 of 1837 dropped clients). So the prefill leg is never closed
    for a gone client: its answer is read and the decode reads the KV, then is closed."""

    async def scenario(vllm: FakeVllm, r: VllmRouter, router: str) -> None:
        client = _client(router, _ask("early", stream=False, max_tokens=400))
        await asyncio.wait_for(vllm.prefill_entered.wait(), 10)
        client.cancel()  # while the prefill computes
        assert await wait_until(lambda: bool(r.releases), 10), "the legs were not kept"
        vllm.prefill_go.set()  # the prefill finishes after its client left
        assert await wait_until(lambda: bool(vllm.ended), 10), "the decode never got the leg"
        assert not vllm.prefill_aborted.is_set()
        assert [(p, how) for p, how, _ in vllm.ended] == [("early", "done")]
        assert vllm.engine[0]["kv_transfer_params"] == PARAMS
        assert await wait_until(lambda: not r.releases, 5)
        status, _ = await _post(  # and the router goes on serving
            router + "/v1/completions", _ask("next", stream=False, max_tokens=4)
        )
        assert status == 200 and [b["prompt"] for b in vllm.engine] == ["early", "next"]

    run(lambda: FakeVllm(tokenize_s=0.0, prefill_held=True), scenario)


def test_past_the_bound_a_gone_clients_prefill_leg_is_closed() -> None:
    async def scenario(vllm: FakeVllm, r: VllmRouter, router: str) -> None:
        vllm.prefill_hangs = True
        client = _client(router, _ask("early", stream=False, max_tokens=4))
        await asyncio.wait_for(vllm.prefill_entered.wait(), 10)
        client.cancel()
        await asyncio.wait_for(vllm.prefill_aborted.wait(), 10)  # vLLM frees the KV itself
        assert not vllm.decode_entered.is_set() and not r.releases

    run(lambda: FakeVllm(tokenize_s=0.0), scenario, max_releases=0)


def test_legs_kept_for_gone_clients_have_a_deadline_and_a_bound() -> None:
    """A decode that never answers (its read wedged) is let go at the deadline; past
    `max_releases` legs kept at once, the next is closed at once (its lease frees the KV)."""
    deadline = 2.0

    async def scenario(vllm: FakeVllm, r: VllmRouter, router: str) -> None:
        dropped = {}
        for n, prompt in enumerate(("kept", "over-bound"), start=1):
            client = _client(router, _ask(prompt, stream=False, max_tokens=4))
            assert await wait_until(lambda n=n: len(vllm.engine) == n, 10)  # fmt: skip
            client.cancel()
            dropped[prompt] = asyncio.get_running_loop().time()
        assert await wait_until(lambda: len(vllm.ended) == 2, 10)
        ended = {p: (how, at) for p, how, at in vllm.ended}
        assert [p for p, _, _ in vllm.ended] == ["over-bound", "kept"]
        assert ended["kept"][0] == "aborted"
        assert ended["kept"][1] - dropped["kept"] >= deadline - 0.1
        assert await wait_until(lambda: not r.releases, 5)

    run(lambda: FakeVllm(tokenize_s=0.0, decode_hangs=True), scenario,
        release_deadline_s=deadline, max_releases=1)  # fmt: skip
