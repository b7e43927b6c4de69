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
side). A client that disconnects cancels the leg in flight, which vLLM treats as an abort.
Endpoints come from the same Discovery as pdworker's router, so a cordoned decode (readiness
gate False) stops getting new work.
"""

from __future__ import annotations

import copy
import logging
import random
from typing import Any

import aiohttp
from aiohttp import web

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


class VllmRouter(RouterShell):
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
        path = request.path
        assert self.session is not None
        try:
            async with self.session.post(prefill + path, json=prefill_request(body)) as resp:
                answer = await resp.json(content_type=None)
                if resp.status != 200 or not isinstance(answer, dict):
                    return self._failed(
                        "transfer_error", 502, f"prefill {prefill} answered {resp.status}",
                        prefill=prefill, answer=answer,
                    )  # fmt: skip
            leg = decode_request(body, answer)
        except BadRequest as exc:
            return self._failed("transfer_error", 502, str(exc), prefill=prefill)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            return self._failed("peer_lost", 502, f"prefill {prefill}: {exc!r}", prefill=prefill)
        try:
            return await self._relay(request, decode + path, leg)
        except (aiohttp.ClientError, TimeoutError) as exc:
            return self._failed("peer_lost", 502, f"decode {decode}: {exc!r}", decode=decode)

    async def _relay(
        self, request: web.Request, url: str, leg: dict[str, Any]
    ) -> web.StreamResponse:
        """Decode's answer to the client as it comes (SSE chunks or one JSON body)."""
        assert self.session is not None
        async with self.session.post(url, json=leg) as resp:
            out = web.StreamResponse(status=resp.status)
            out.content_type = resp.content_type or "application/json"
            await out.prepare(request)
            async for chunk in resp.content.iter_chunked(STREAM_CHUNK):
                await out.write(chunk)
            await out.write_eof()
            if resp.status == 200:
                self.metrics.completed.labels(role="router").inc()
            else:
                self.metrics.failed.labels(reason="transfer_error").inc()
            return out
