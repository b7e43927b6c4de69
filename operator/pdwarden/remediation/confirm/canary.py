"""The canary that confirms a frozen vLLM decode: one token asked of its API server, in time.

Why it exists: with vLLM 0.32's NixlConnector a decode whose engine froze behind its live API
server shows nothing on its own metrics (requests never reach its scheduler: running = waiting
= 0, measured) and its /health answers 200 (`AsyncLLM.check_health`, v1/engine/async_llm.py:
1089-1092, fails only once the engine core has *died*); only the prefill's expired leases show
it (detect/pull.py, LeaseExpired), and they name no decode. So a suspect decode is asked:

1. GET /v1/models. The API server answers it from its own configuration, without the engine
   (entrypoints/openai/models/api_router.py:20-25 -> models/serving.py:64-76, the base models
   first): an answer proves the server and the path to it alive. The first model id is used.
2. POST /v1/completions {"model": id, "prompt": "pdwarden canary", "max_tokens": 1}. Without
   kv_transfer_params the NixlConnector pulls nothing (nixl/pull_scheduler.py:59: only
   `do_remote_prefill` does), so the decode computes the few prompt tokens itself: a live
   engine answers within a few steps, a frozen one never does.

Verdicts: alive (200 with a choice); dead (the request went out on an open connection and no
answer began within the deadline: the engine never produced the token); unknown (anything else:
refused, reset, a connect that hangs, an HTTP error such as 401 from a server run with
--api-key, an answer that is not JSON or over the byte cap, no connection slot free). Only dead
leads to an action (decide/verdicts.py), and a wrong dead cordons a serving pod, so the deadline
is long (CANARY_SECONDS) and every doubt is unknown.

Bounds: a canary holds one connection slot of its tenant's share of the scrape client
(`scrape.worker_client.Share`, the per-object share every worker call goes through), so one object's
canaries never take another's slots; the wait for a slot, the connect, both requests and both
answers have deadlines (a canary ends within MODELS_SECONDS x 2 + CANARY_SECONDS); answers are
read to MAX_ANSWER_BYTES at most and decoded as JSON only.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, Final, Protocol

import aiohttp

from pdwarden.remediation.scrape.http1 import BodyTooLarge
from pdwarden.remediation.scrape.worker_client import Share, read_capped
from pdwarden.values import CanaryResult, Target

# How long a decode gets to produce one token for a 3-token prompt. A live engine needs a few
# scheduler steps; vLLM on two busy CPU cores took up to ~28 s per step (docs/engines.md, the CPU
# pair's KV lease), so 30 s keeps a slow but live engine from being called dead. A frozen one never
# answers, however long we wait; the cost of waiting is a longer cycle while a decode is suspect.
CANARY_SECONDS: Final = 30.0
MODELS_SECONDS: Final = 5.0  # GET /v1/models: the API server answers it alone, at once
CONNECT_SECONDS: Final = 5.0  # a connect that hangs is the network's doing: unknown, not dead
MAX_ANSWER_BYTES: Final = 64 * 1024  # a model list or a one-token completion: a few KiB
MAX_MODEL_ID: Final = 256
MODELS_PATH: Final = "/v1/models"
COMPLETIONS_PATH: Final = "/v1/completions"
PROMPT: Final = "pdwarden canary"


class Shares(Protocol):
    """Where a canary's connection comes from: the scrape client's per-tenant shares and its
    session (`scrape.worker_client.WorkerClient`)."""

    def share(self, tenant: str) -> Share: ...

    def session(self) -> aiohttp.ClientSession: ...


class Unknown(Exception):
    """Why a canary proves nothing, in our own words (never the server's)."""


def model_id(data: Any) -> str:
    """The first model id of a GET /v1/models answer (OpenAI's list shape)."""
    models = data.get("data") if isinstance(data, dict) else None
    first = models[0] if isinstance(models, list) and models else None
    mid = first.get("id") if isinstance(first, dict) else None
    if not isinstance(mid, str) or not 0 < len(mid) <= MAX_MODEL_ID or not mid.isprintable():
        raise Unknown(f"GET {MODELS_PATH}: no usable model id in the answer")
    return mid


def has_choice(data: Any) -> bool:
    """A completion answer with at least one choice (the engine produced the token)."""
    choices = data.get("choices") if isinstance(data, dict) else None
    return isinstance(choices, list) and bool(choices) and isinstance(choices[0], dict)


def _http_error(what: str, status: int) -> Unknown:
    refused = status in (401, 403)
    hint = " (the server runs with --api-key and refuses the canary)" if refused else ""
    return Unknown(f"{what}: HTTP {status}{hint}")


async def read_json(resp: aiohttp.ClientResponse, what: str) -> Any:
    """A 200 answer, read to the cap and decoded as JSON (nothing else is ever decoded)."""
    if resp.status != 200:
        raise _http_error(what, resp.status)
    try:
        body = await read_capped(resp, what, MAX_ANSWER_BYTES)
    except BodyTooLarge:
        raise Unknown(f"{what}: answer over the {MAX_ANSWER_BYTES}-byte cap") from None
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        raise Unknown(f"{what}: answer is not JSON") from None


class Canary:
    """Asks one decode pod for one token (satisfies `ports.CanaryApi`)."""

    def __init__(
        self,
        shares: Shares,
        deadline: float = CANARY_SECONDS,
        models_deadline: float = MODELS_SECONDS,
    ) -> None:
        if deadline <= 0 or models_deadline <= 0:
            raise ValueError("canary deadlines must be > 0")
        self.shares = shares
        self.deadline = deadline
        self.models_deadline = models_deadline

    async def probe(self, target: Target, tenant: str = "") -> CanaryResult:
        """The verdict on `target`; never raises (but cancellation)."""
        try:
            return await self._probe(target, tenant)
        except Unknown as e:
            return CanaryResult(target.pod, "unknown", str(e))
        except Exception as e:  # anything unforeseen proves nothing either
            return CanaryResult(target.pod, "unknown", f"canary failed: {type(e).__name__}")

    async def _probe(self, target: Target, tenant: str) -> CanaryResult:
        slots = self.shares.share(tenant).slots
        try:  # as short as the model list: a canary starts promptly or proves nothing
            async with asyncio.timeout(self.models_deadline):
                await slots.acquire()
        except TimeoutError:
            raise Unknown(f"no connection slot free within {self.models_deadline:g}s") from None
        try:
            model = await self._model(target)
            return await self._generate(target, model)
        finally:
            slots.release()

    async def _model(self, target: Target) -> str:
        what = f"GET {MODELS_PATH}"
        timeout = aiohttp.ClientTimeout(total=self.models_deadline)
        try:
            async with (
                asyncio.timeout(self.models_deadline),
                self.shares.session().get(target.base + MODELS_PATH, timeout=timeout) as resp,
            ):
                return model_id(await read_json(resp, what))
        except aiohttp.ClientError as e:
            raise Unknown(f"{what}: {type(e).__name__}") from None
        except TimeoutError:
            raise Unknown(f"{what}: no answer within {self.models_deadline:g}s") from None
        except OSError as e:
            raise Unknown(f"{what}: {type(e).__name__}") from None

    async def _generate(self, target: Target, model: str) -> CanaryResult:
        what = f"POST {COMPLETIONS_PATH}"
        request = {"model": model, "prompt": PROMPT, "max_tokens": 1}
        # The deadline is ours (asyncio.timeout); aiohttp only bounds the connect, so a connect
        # that hangs is told apart from an engine that does not answer.
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=min(CONNECT_SECONDS, self.deadline / 2)
        )
        started = time.monotonic()
        answering = False
        try:
            async with asyncio.timeout(self.deadline):
                url = target.base + COMPLETIONS_PATH
                async with self.shares.session().post(url, json=request, timeout=timeout) as resp:
                    answering = True
                    data = await read_json(resp, what)
        except aiohttp.ClientError as e:  # refused, reset, the connect timed out: unknown
            raise Unknown(f"{what}: {type(e).__name__}") from None
        except TimeoutError:
            if answering:
                raise Unknown(f"{what}: the answer began but did not end within "
                              f"{self.deadline:g}s") from None  # fmt: skip
            return CanaryResult(
                target.pod, "dead",
                f"no token within {self.deadline:g}s while its API server answers "
                f"{MODELS_PATH} (engine frozen behind a live API server)",
            )  # fmt: skip
        except OSError as e:
            raise Unknown(f"{what}: {type(e).__name__}") from None
        if not has_choice(data):
            raise Unknown(f"{what}: answer without a choice")
        return CanaryResult(target.pod, "alive", f"a token in {time.monotonic() - started:.1f}s")
