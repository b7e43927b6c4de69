"""The router's vLLM mode: OpenAI requests routed through vLLM's prefill/decode protocol.

Why its own module: stock vLLM with the NixlConnector pairs prefill and decode through the
client, not through a bootstrap room. What llm-d's routing sidecar and vLLM's example proxy
(examples/online_serving/disaggregated_serving/) do, and this module does:

1. send the request to a prefill with `kv_transfer_params = {"do_remote_decode": true, ...}`,
   `max_tokens` 1 and no streaming; prefill computes the prompt's KV, keeps its blocks for decode
   (leased for `kv_lease_duration`, nixl/base_scheduler.py) and answers with the
   `kv_transfer_params` a decode needs (remote engine id, block ids, side-channel host/port,
   request id);
2. send the ORIGINAL request to a decode with those `kv_transfer_params`: decode pulls the KV
   with a NIXL READ and generates; its answer (streamed or not) goes back to the client.

Prefill first, then decode, in sequence (unlike pdworker's rooms, nothing waits on the other
side). Once the prefill has finished a request, it holds the KV blocks for a decode until one
reads them or the lease runs out: a client that disconnects must not stop the legs, or the
blocks stay taken for the whole lease (measured on the real pair: a prefill busy for 145 s after
a storm of dropped clients). That holds during the prefill leg too: closing it aborts the
request in vLLM only while its engine still runs it; one that finished while its answer was on
the way is not aborted, and its blocks stay (measured: 62 of 1837 clients dropped 0-600 ms into
their request, in a 10-minute storm, each held a prefill's KV for the whole lease). So both legs
run in their own task; when the client is gone they go on until the decode has answered its
first bytes (a first token needs the KV read: the blocks are freed) and are then closed, which
vLLM treats as an abort of the rest. The price: the prefill of a request whose client left is
computed, and its KV read once. vLLM frees the prefill's blocks for an aborted decode request too
(nixl pull_scheduler.request_finished: one aborted before it was scheduled notifies the prefill;
one whose read started finishes the read), but only once its engine has the request: closed
earlier (while its API server still tokenizes, or before it read the request at all), the
request never reaches the engine and nothing tells the prefill. Such releases are bounded: a
deadline (RELEASE_DEADLINE_S, past which the lease has freed the blocks anyway) and at most
MAX_RELEASES at once (past that, vLLM's abort and the lease free the rest, as before).
Endpoints come from the same Discovery as pdworker's router, so a cordoned decode (readiness
gate False) stops getting new work.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import random
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from pdworker.discovery import Discovery
from pdworker.router_shell import RouterShell
from pdworker.server import BadRequest, client_error, error, read_json

log = logging.getLogger(__name__)
COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
# What a prefill is asked for (vLLM 0.32 nixl/connector.py reads these keys; the example proxy
# sends the same). The rest of kv_transfer_params is filled in by prefill's answer.
PREFILL_KV_PARAMS: dict[str, Any] = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}
STREAM_CHUNK = 16 * 1024
# Legs whose client has gone are given this long to reach the decode's engine: past vLLM's
# default kv_lease_duration (30 s, nixl/base_scheduler.py) the prefill freed the blocks.
RELEASE_DEADLINE_S = 30.0
MAX_RELEASES = 64  # legs kept going for clients that left, at most, at once


def prefill_request(body: dict[str, Any]) -> dict[str, Any]:
    """The prefill leg: one token, no streaming, asking prefill to keep its KV for a decode."""
    out = copy.deepcopy(body)
    out["kv_transfer_params"] = dict(PREFILL_KV_PARAMS)
    out["stream"] = False
    out.pop("stream_options", None)
    out["max_tokens"] = 1
    if "max_completion_tokens" in out:
        out["max_completion_tokens"] = 1
    return out


def decode_request(body: dict[str, Any], prefill_answer: dict[str, Any]) -> dict[str, Any]:
    """The decode leg: the client's request with the prefill's kv_transfer_params."""
    params = prefill_answer.get("kv_transfer_params")
    if not isinstance(params, dict) or not params.get("remote_engine_id"):
        raise BadRequest(
            "prefill answered without kv_transfer_params: is it a vLLM with a KV connector?"
        )
    out = copy.deepcopy(body)
    out["kv_transfer_params"] = params
    return out


@dataclass
class _Opened:
    """A decode leg the decode has begun to answer: its response and the first bytes read."""

    resp: aiohttp.ClientResponse
    first: bytes


class VllmRouter(RouterShell):
    def __init__(
        self, discovery: Discovery, incarnation: str, request_timeout: float = 600.0
    ) -> None:
        super().__init__(discovery, incarnation, request_timeout)
        self.release_deadline_s = RELEASE_DEADLINE_S
        self.max_releases = MAX_RELEASES
        self.releases: set[asyncio.Task[_Opened | web.Response]] = set()

    async def stop(self) -> None:
        for task in list(self.releases):
            task.cancel()
        await asyncio.gather(*self.releases, return_exceptions=True)
        await super().stop()

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post(COMPLETIONS, self.handle)
        app.router.add_post(CHAT, self.handle)

    def _failed(self, reason: str, status: int, message: str, **extra: Any) -> web.Response:
        self.metrics.failed.labels(reason=reason).inc()
        return error(status, message, reason=reason, **extra)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await read_json(request)
            if not isinstance(body, dict):
                raise BadRequest("body must be a JSON object")
        except BadRequest as exc:
            return client_error(exc)
        prefills, decodes = self.discovery.prefill(), self.discovery.decode()
        if not prefills or not decodes:
            return self._failed("aborted", 503, "no ready prefill or decode endpoint")
        prefill, decode = random.choice(prefills), random.choice(decodes)
        # The prefill may hold KV for a decode from any moment on: the legs run whether or not
        # the client stays (the module's docstring says why).
        leg = asyncio.create_task(self._legs(body, prefill, decode, request.path))
        try:
            opened = await asyncio.shield(leg)
        except asyncio.CancelledError:
            self.metrics.failed.labels(reason="aborted").inc()
            self._keep_releasing(leg)
            raise
        if isinstance(opened, web.Response):
            return opened
        return await self._relay(request, opened)

    async def _legs(
        self, body: dict[str, Any], prefill: str, decode: str, path: str
    ) -> _Opened | web.Response:
        """The prefill leg answered and read, the decode leg sent and its first bytes read (or
        why not). Cancelled, it closes the leg in flight: vLLM aborts what its engine runs."""
        assert self.session is not None
        try:
            answered = await self.session.post(prefill + path, json=prefill_request(body))
        except (aiohttp.ClientError, TimeoutError) as exc:
            return self._failed("peer_lost", 502, f"prefill {prefill}: {exc!r}", prefill=prefill)
        try:
            async with answered:
                answer = await answered.json(content_type=None)
            if answered.status != 200 or not isinstance(answer, dict):
                return self._failed(
                    "transfer_error", 502, f"prefill {prefill} answered {answered.status}",
                    prefill=prefill, answer=answer,
                )  # fmt: skip
            leg = decode_request(body, answer)
        except BadRequest as exc:
            return self._failed("transfer_error", 502, str(exc), prefill=prefill)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            return self._failed("peer_lost", 502, f"prefill {prefill}: {exc!r}", prefill=prefill)
        try:
            resp = await self.session.post(decode + path, json=leg)
        except (aiohttp.ClientError, TimeoutError) as exc:
            return self._failed("peer_lost", 502, f"decode {decode}: {exc!r}", decode=decode)
        try:
            return _Opened(resp, await resp.content.readany())
        except (aiohttp.ClientError, TimeoutError) as exc:
            resp.close()
            return self._failed("peer_lost", 502, f"decode {decode}: {exc!r}", decode=decode)
        except BaseException:
            resp.close()
            raise

    def _keep_releasing(self, leg: asyncio.Task[_Opened | web.Response]) -> None:
        """The client left: let the legs go on until the decode has begun to answer, then close
        it (vLLM aborts the rest); within a deadline, and at most `max_releases` at once (past
        that they are cancelled: vLLM aborts a prefill still running, the lease frees the rest)."""
        if not leg.done():
            if len(self.releases) >= self.max_releases:
                log.warning("%d legs of gone clients in flight: one more left to vLLM's abort "
                            "and the prefill's KV lease", len(self.releases))  # fmt: skip
                leg.cancel()
            else:
                self.releases.add(leg)
                deadline = asyncio.get_running_loop().call_later(
                    self.release_deadline_s, leg.cancel
                )
                leg.add_done_callback(lambda _: deadline.cancel())
        leg.add_done_callback(self._released)

    def _released(self, leg: asyncio.Task[_Opened | web.Response]) -> None:
        self.releases.discard(leg)
        if leg.cancelled():
            return
        if leg.exception() is not None:
            log.info("decode leg of a gone client: %r", leg.exception())
            return
        opened = leg.result()
        if isinstance(opened, _Opened):
            opened.resp.close()  # the decode has the request and its KV: vLLM aborts the rest

    async def _relay(self, request: web.Request, opened: _Opened) -> web.StreamResponse:
        """Decode's answer to the client as it comes (SSE chunks or one JSON body)."""
        resp = opened.resp
        out = web.StreamResponse(status=resp.status)
        out.content_type = resp.content_type or "application/json"
        try:
            await out.prepare(request)
            if opened.first:
                await out.write(opened.first)
            async for chunk in resp.content.iter_chunked(STREAM_CHUNK):
                await out.write(chunk)
            await out.write_eof()
        except (aiohttp.ClientError, TimeoutError, ConnectionError) as exc:
            resp.close()  # the client or the decode went away mid-answer: vLLM aborts the rest
            log.info("relaying %s: %r", resp.url, exc)
            self.metrics.failed.labels(reason="peer_lost").inc()
            return out
        except asyncio.CancelledError:  # the client left: the KV was read, vLLM aborts the rest
            resp.close()
            self.metrics.failed.labels(reason="aborted").inc()
            raise
        resp.release()
        if resp.status == 200:
            self.metrics.completed.labels(role="router").inc()
        else:
            self.metrics.failed.labels(reason="transfer_error").inc()
        return out
