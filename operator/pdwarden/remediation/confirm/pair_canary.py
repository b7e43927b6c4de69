"""The pair canary: one request of one output token through a prefill and then a decode, sent
the way the engine's own router sends it, so the KV really moves between the two.

Why it exists: a frozen engine behind a live API server shows nothing but flat counters, and so
does an idle one; a prefill frozen with no read in flight shows nothing at all. Nobody else asks
the real transfer path of a pair (SGLang's /health uses a fake bootstrap, Dynamo's canary skips
vLLM decodes). So a pod whose counters stopped (`decide.pairs`) is asked, through its pair's own PD
path: for vLLM, the prefill leg with `kv_transfer_params.do_remote_decode` and the decode leg
with the prefill's answer, which makes the decode pull the KV over NIXL. SGLang's two legs go
out at once and wait on each other (a frozen prefill leaves both unanswered), so for it the
canary is the "health" protocol: both sides' own health checks at once (SGLang's /health, which
its scheduler answers however busy, and which answers 503 when the scheduler did not answer within
SGLANG_HEALTH_CHECK_TIMEOUT), which name the side that stopped, and beside them one PD request of
one token to both sides (the prefill's bootstrap address and a room, as SGLang's router sends it):
when it completes the KV really moved (outcome decoded, with the time); when it does not while
both health checks answered, the pair is alive and the detail says how the KV request ended.

Outcomes, per leg in order: no answer within the deadline on an open connection while the
pod's own progress counters (scraped before and after, through the same client) did not move
either: that side is dead. A leg that times out while its pod's counters move is a slow engine,
not a dead one: unknown. Anything else that is not an answer (refused, reset, an HTTP error such
as 401 from a server run with --api-key, garbage, an answer over the byte cap, a prefill answer
without what the decode leg must carry) is unknown, and unknown never acts. Both legs answered:
decoded, with the time.

Bounds: each leg holds one connection slot of its tenant's share only while it runs; every
step has a deadline (a pair canary ends within MODELS_SECONDS + 2 x deadline + two scrapes);
answers are read to MAX_ANSWER_BYTES and decoded as JSON only.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from http import HTTPStatus
from typing import Any, Final

import aiohttp

from pdwarden.ports import WorkerApi
from pdwarden.remediation.confirm.canary import (
    CONNECT_SECONDS,
    MODELS_SECONDS,
    Shares,
    Unknown,
    has_choice,
    model_id,
    read_json,
)
from pdwarden.values import PairCanary, PairOutcome, PairResult, Sample, Target

PROGRESS: Final = ("prefill_tokens", "generated_tokens", "kv_transfers", "completed", "failed")
KV_SLOT_SECONDS: Final = 0.5  # the "health" protocol's KV request waits this long for slots


class _Dead(Exception):
    """The leg got no answer in time (its pod's counters decide whether that means dead)."""


@dataclass(frozen=True)
class _Call:
    """One canary's fixed inputs, which every leg reads."""

    canary: PairCanary
    tenant: str
    deadline: float
    sent: set[str]  # the roles whose leg was posted (what the canary may have added)


@dataclass(frozen=True)
class _Ended:
    """A leg that ended the canary: the outcome and why."""

    outcome: PairOutcome
    why: str


def _room() -> int:
    """A bootstrap room number as SGLang's router draws them (any 63-bit integer)."""
    return random.randrange(2**63)


def _generated(answer: Any) -> bool:
    """An SGLang /generate answer: its text and the request's meta_info."""
    return (
        isinstance(answer, dict)
        and isinstance(answer.get("text"), str)
        and isinstance(answer.get("meta_info"), dict)
    )


def progressed(before: Sample | None, after: Sample | None) -> bool | None:
    """Whether any progress counter differs between two samples; None if either is missing."""
    if before is None or after is None:
        return None
    return any(getattr(before, c) != getattr(after, c) for c in PROGRESS)


class PairCanarySender:
    """Sends pair canaries (satisfies `ports.PairCanaryApi`)."""

    def __init__(self, shares: Shares, workers: WorkerApi) -> None:
        self.shares, self.workers = shares, workers

    async def pair(
        self, prefill: Target, decode: Target, canary: PairCanary, tenant: str = "",
        deadline: float = 8.0,
    ) -> PairResult:  # fmt: skip
        """The outcome of one canary through `prefill` then `decode`, each leg within
        `deadline` seconds; never raises (but cancellation)."""
        if deadline <= 0:
            return PairResult(prefill.pod, decode.pod, "unknown", "no time given to the canary")
        call = _Call(canary, tenant, deadline, set())
        try:
            res = await self._pair(prefill, decode, call)
        except Unknown as e:
            res = PairResult(prefill.pod, decode.pod, "unknown", str(e))
        except Exception as e:  # anything unforeseen proves nothing either
            why = f"pair canary failed: {type(e).__name__}"
            res = PairResult(prefill.pod, decode.pod, "unknown", why)
        return replace(res, prefill_sent="prefill" in call.sent, decode_sent="decode" in call.sent,
                       kv_sent="kv" in call.sent)  # fmt: skip

    async def _sample(self, target: Target, tenant: str) -> Sample | None:
        (res,) = await self.workers.scrape([target], None, tenant)
        return res.sample

    async def _pair(self, prefill: Target, decode: Target, call: _Call) -> PairResult:
        started = time.monotonic()
        canary, tenant = call.canary, call.tenant
        before = await asyncio.gather(self._sample(prefill, tenant), self._sample(decode, tenant))
        if canary.protocol == "health":
            return await self._health(prefill, decode, call, before, started)
        model = await self._model(prefill, canary, tenant)
        answer = await self._leg(call, "prefill", prefill, canary.prefill_body(model), before[0])
        if isinstance(answer, _Ended):
            return PairResult(prefill.pod, decode.pod, answer.outcome, answer.why)
        body = canary.decode_body(model, answer)
        if body is None:
            raise Unknown(f"the prefill's answer carries no {canary.carried} for the decode leg")
        done = await self._leg(call, "decode", decode, body, before[1])
        if isinstance(done, _Ended):
            return PairResult(prefill.pod, decode.pod, done.outcome, done.why,
                              prefill_answered=True)  # fmt: skip
        took = time.monotonic() - started
        return PairResult(
            prefill.pod, decode.pod, "decoded",
            f"{prefill.pod} -> {decode.pod}: KV moved and a token decoded in {took:.1f}s",
            seconds=took, prefill_answered=True, decode_answered=True,
        )  # fmt: skip

    async def _health(
        self, prefill: Target, decode: Target, call: _Call,
        before: Sequence[Sample | None], started: float,
    ) -> PairResult:  # fmt: skip
        """Both sides' own health checks at once; a side that fails its own (no answer in time,
        or the engine's own verdict that its scheduler did not answer) while its counters stand
        still is dead, the prefill named first."""
        p, d, kv = await asyncio.gather(
            self._check(call, "prefill", prefill, before[0]),
            self._check(call, "decode", decode, before[1]),
            self._kv(call, prefill, decode),
        )
        answered = {"prefill_answered": p is None, "decode_answered": d is None}
        ended = [e for e in (p, d) if e is not None]
        for e in sorted(ended, key=lambda e: not e.outcome.endswith("_dead")):
            return PairResult(prefill.pod, decode.pod, e.outcome, e.why, **answered)
        took = time.monotonic() - started
        both = f"{prefill.pod} and {decode.pod}: both answered their own health checks"
        if isinstance(kv, float):
            return PairResult(
                prefill.pod, decode.pod, "decoded",
                f"{prefill.pod} -> {decode.pod}: KV moved and a token decoded in {kv:.1f}s; "
                f"{both}", seconds=kv, prefill_answered=True, decode_answered=True,
            )  # fmt: skip
        return PairResult(
            prefill.pod, decode.pod, "alive", f"{both} in {took:.1f}s{kv}", seconds=took,
            prefill_answered=True, decode_answered=True,
        )  # fmt: skip

    async def _kv(self, call: _Call, prefill: Target, decode: Target) -> float | str:
        """The "health" protocol's KV request, where the engine has one and the prefill's
        bootstrap port is known: the same body to both sides at once (SGLang's PD protocol);
        the seconds until both answered and the decode's answer is a generation, else why not
        (in words to append to the detail; "" when none was sent). It names no side: the two
        legs wait on each other, so a frozen side leaves both unanswered (the health checks
        beside it name that side); it proves the KV path when it completes."""
        canary = call.canary
        if not canary.kv_path or prefill.bootstrap_port <= 0:
            return ""
        # Both legs or neither (a lone prefill leg would wait for its decode in SGLang's
        # bootstrap queue), and never at the health checks' expense: slots free now, or none.
        slots, held = self.shares.share(call.tenant).slots, 0
        try:
            try:
                for _ in range(2):
                    async with asyncio.timeout(KV_SLOT_SECONDS):
                        await slots.acquire()
                    held += 1
            except TimeoutError:
                return "; no KV request: no connection slots free for it"
            body = canary.kv_body(prefill.ip, prefill.bootstrap_port, _room())
            call.sent.add("kv")
            started = time.monotonic()
            legs = await asyncio.gather(
                self._send(call, prefill, canary.kv_path, body,
                           f"KV request's prefill leg on {prefill.pod}"),
                self._send(call, decode, canary.kv_path, body,
                           f"KV request's decode leg on {decode.pod}"),
                return_exceptions=True,
            )  # fmt: skip
        finally:
            for _ in range(held):
                slots.release()
        for leg, pod in zip(legs, (prefill.pod, decode.pod), strict=True):
            if isinstance(leg, _Dead):
                return f"; its KV request got no answer from {pod} within {call.deadline:g}s"
            if isinstance(leg, Unknown):
                return f"; its KV request: {leg}"
            if isinstance(leg, BaseException):
                raise leg
        if not _generated(legs[1]):
            return f"; its KV request: the answer of {decode.pod} is not a generation"
        return time.monotonic() - started

    async def _check(
        self, call: _Call, role: str, target: Target, before: Sample | None
    ) -> _Ended | None:
        """None when the side's health check answered 200, else how it ended."""
        what = f"{role} health check on {target.pod}"
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_SECONDS)
        slots = self.shares.share(call.tenant).slots
        try:  # a wait for a connection slot is ours, never the pod's silence
            async with asyncio.timeout(MODELS_SECONDS):
                await slots.acquire()
        except TimeoutError:
            return _Ended("unknown", f"{what}: no connection slot free within {MODELS_SECONDS:g}s")
        call.sent.add(role)
        try:
            async with (
                asyncio.timeout(call.deadline),
                self.shares.session().get(target.base + call.canary.path, timeout=timeout) as r,
            ):
                if r.status == 200:
                    return None
                if r.status != HTTPStatus.SERVICE_UNAVAILABLE:
                    return _Ended("unknown", f"{what}: HTTP {r.status}")
                late = f"{what}: 503, the engine's own verdict that its scheduler did not answer"
        except TimeoutError:  # before OSError, which it is
            late = f"{what}: no answer within {call.deadline:g}s"
        except (aiohttp.ClientError, OSError) as e:
            return _Ended("unknown", f"{what}: {type(e).__name__}")
        finally:
            slots.release()
        return await self._silent(call, role, target, before, late)

    async def _silent(
        self, call: _Call, role: str, target: Target, before: Sample | None, late: str
    ) -> _Ended:
        """How a side that gave no answer ends the canary: dead only while its own counters
        stand still (a slow engine moves them)."""
        moved = progressed(before, await self._sample(target, call.tenant))
        if moved is None:
            return _Ended("unknown", f"{late} and its metrics unreadable")
        if moved:
            return _Ended("unknown", f"{late}, but its counters move (slow, not dead)")
        outcome: PairOutcome = "prefill_dead" if role == "prefill" else "decode_dead"
        return _Ended(outcome, f"{late} while its API server answers and its own counters "
                               "stand still (engine frozen)")  # fmt: skip

    async def _model(self, target: Target, canary: PairCanary, tenant: str) -> str:
        what = f"GET {canary.models_path} on {target.pod}"
        timeout = aiohttp.ClientTimeout(total=MODELS_SECONDS)
        try:
            async with (
                asyncio.timeout(MODELS_SECONDS),
                self.shares.share(tenant).slots,
                self.shares.session().get(target.base + canary.models_path, timeout=timeout) as r,
            ):
                return model_id(await read_json(r, what))
        except (aiohttp.ClientError, OSError) as e:
            raise Unknown(f"{what}: {type(e).__name__}") from None
        except TimeoutError:
            raise Unknown(f"{what}: no answer within {MODELS_SECONDS:g}s") from None

    async def _leg(
        self, call: _Call, role: str, target: Target, body: dict[str, Any], before: Sample | None
    ) -> Any:
        """The leg's JSON answer, or how it ended the canary."""
        what = f"{role} leg on {target.pod}"
        call.sent.add(role)
        try:
            answer = await self._post(call, target, body, what)
        except _Dead:
            late = f"{what}: no answer within {call.deadline:g}s"
            return await self._silent(call, role, target, before, late)
        if not has_choice(answer):
            raise Unknown(f"{what}: answer without a choice")
        return answer

    async def _post(self, call: _Call, target: Target, body: dict[str, Any], what: str) -> Any:
        slots = self.shares.share(call.tenant).slots
        try:  # as short as the model list: a leg starts promptly or proves nothing
            async with asyncio.timeout(MODELS_SECONDS):
                await slots.acquire()
        except TimeoutError:
            raise Unknown(f"{what}: no connection slot free within {MODELS_SECONDS:g}s") from None
        try:
            return await self._send(call, target, call.canary.path, body, what)
        finally:
            slots.release()

    async def _send(
        self, call: _Call, target: Target, path: str, body: dict[str, Any], what: str
    ) -> Any:
        """One POST within the deadline, on a connection slot the caller holds."""
        deadline = call.deadline
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=min(CONNECT_SECONDS, deadline / 2))
        answering = False
        try:
            async with asyncio.timeout(deadline):
                session = self.shares.session()
                async with session.post(target.base + path, json=body, timeout=timeout) as resp:
                    answering = True
                    return await read_json(resp, what)
        except aiohttp.ClientError as e:
            raise Unknown(f"{what}: {type(e).__name__}") from None
        except TimeoutError:
            if answering:
                raise Unknown(f"{what}: the answer began but did not end in time") from None
            raise _Dead from None
        except OSError as e:
            raise Unknown(f"{what}: {type(e).__name__}") from None
