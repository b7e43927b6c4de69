"""AbortRequests: the one repair call a stock SGLang prefill accepts, abort every request it holds.

Why its own module: SGLang 0.5.23 applies no timeout to rooms in a prefill's inflight queue
(disaggregation/prefill.py), so a wedged room stays there for ever. What does free it is
`POST /abort_request {"rid": "", "abort_all": true}` (entrypoints/http_server.py:1721-1731 ->
TokenizerManager.abort_request, managers/tokenizer_manager.py:2241-2265 -> Scheduler.abort_request,
managers/scheduler.py:5675-5812): the scheduler drops its waiting queue, calls the KV sender's
`abort()` for every request in the bootstrap and inflight queues (:5740-5758;
disaggregation/common/conn.py marks the room Failed, a terminal status), finishes running
requests with FINISH_ABORT (:5797-5812), and the next inflight poll releases their KV.

Why abort_all, the widest call, is the narrowest an operator has in 0.5.23:
* Per request: the only selector AbortReq carries is `rid` (managers/io_struct.py:2285-2296: rid,
  abort_all, finished_reason, abort_message; no DP rank, no bootstrap room), matched as a prefix
  of each queued request's rid (scheduler.py:5677, 5688, 5744, 5755, 5800). A rid is chosen by
  whoever sent /generate (io_struct.py:180, GenerateReqInput.rid; the router) or drawn as a
  uuid4 by SGLang (io_struct.py:385-387); pdwarden is not in the request path, and SGLang
  publishes no rid: /metrics has none in any label (observability/metrics_collector.py),
  /server_info's internal_states are config, memory and the PD role
  (managers/scheduler_components/internal_state.py:45-63), and no route lists requests. An empty
  rid without abort_all is ignored (tokenizer_manager.py:2242-2245), and a guessed prefix would
  abort whatever it happens to match.
* Per bootstrap room: rooms are chosen by the router too (io_struct.py:293,
  GenerateReqInput.bootstrap_room), the prefill publishes none, and abort never matches on them.
* Per DP rank: an AbortReq is a control message the DP controller sends to every DP rank
  (managers/data_parallel_controller.py:274-278 via the dispatcher's fallback at :418).
So the cost is measured and recorded instead. The endpoint answers 200 whatever it aborted, and
SGLang's `sglang:num_aborted_requests_total` counts calls, not requests
(tokenizer_manager.py:2261-2265), so the prefill's queue gauges are read just before the call
(every request they count is aborted) and just after, through `scrape` (the one reader of
/metrics: same caps, same rank rules); `act.abort_cost` turns them, with the finding's
wedged count, into how many requests the call dropped and how many of those were healthy
(the running gauge is not added: on a prefill it is the last batch, already inflight). Every call
is bounded; nothing here decides whether to call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Protocol

import aiohttp

from pdwarden.ports import WorkerApi
from pdwarden.remediation.act.abort_cost import AbortCost, PrefillQueues, abort_all_cost
from pdwarden.values import Sample, Target

ABORT_PATH: Final = "/abort_request"
DEFAULT_TIMEOUT: Final = 5.0
MAX_ERROR_BODY: Final = 2048


class AdminCallError(OSError):
    """The abort call did not get a usable answer (refused, timed out, HTTP error)."""


@dataclass(frozen=True)
class AbortReport:
    """What one abort_all did: the prefill's queue gauges just before and just after the call."""

    before: PrefillQueues | None
    after: PrefillQueues | None
    status: int

    def cost(self, wedged: int) -> AbortCost:
        """What the call dropped, and how many of those requests were healthy, given the
        finding's count of `wedged` rooms."""
        return abort_all_cost(self.before, wedged)

    @property
    def aborted(self) -> int:
        """Requests aborted: what the prefill held just before the call (0 if unreadable)."""
        return self.cost(0).aborted

    def detail(self, where: str, wedged: int) -> str:
        """For the ledger reason and the Event: the cost first (a long reason is cut at its
        end), then the call."""
        after = (
            f"; inflight gauge right after: {self.after.inflight:g}"
            if self.after is not None and self.after.inflight is not None
            else ""
        )
        return (
            f"{self.cost(wedged).describe(self.before or PrefillQueues())}; "
            f"POST {ABORT_PATH} abort_all=true on {where} (HTTP {self.status}){after} "
            "(SGLang republishes idle gauges up to 30 s later)"
        )


class PrefillAborter(Protocol):
    """What the cycle needs from an SGLang prefill; tests pass an in-memory fake."""

    async def abort_all(
        self, target: Target, token: str | None = None, tenant: str = ""
    ) -> AbortReport: ...


def held_requests(sample: Sample) -> PrefillQueues:
    """Requests per queue from a scraped SGLang sample (ranks already combined by `scrape`:
    dp ranks summed, TP/PP/EP copies counted once, the priority="" totals)."""
    return PrefillQueues(
        running=sample.running,
        waiting=sample.waiting_queue,
        bootstrap=sample.bootstrap_queue,
        inflight=sample.inflight_queue,
    )


class SGLangAdmin:
    """HTTP client for the abort call; the gauges around it are read through `metrics`."""

    def __init__(self, metrics: WorkerApi, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.metrics = metrics
        self.timeout = aiohttp.ClientTimeout(total=timeout)

    async def abort_all(
        self, target: Target, token: str | None = None, tenant: str = ""
    ) -> AbortReport:
        """`token`: SGLang's --admin-api-key, sent as a Bearer token (SGLang 0.5.23,
        srt/utils/auth.py: /abort_request is ADMIN_OPTIONAL, so it needs the key once the
        server has one); a PDRemediationPolicy reads it from spec.adminTokenSecretRef."""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        url = target.base + ABORT_PATH
        before = await self._held(target, tenant)
        async with aiohttp.ClientSession(timeout=self.timeout) as session:
            try:
                async with session.post(
                    url, json={"rid": "", "abort_all": True}, headers=headers
                ) as resp:
                    if resp.status != 200:
                        text = (await resp.content.read(MAX_ERROR_BODY)).decode(errors="replace")
                        raise AdminCallError(
                            f"{url}: HTTP {resp.status}: {text.strip()}" + _auth_hint(resp.status)
                        )
                    status = resp.status
            except (aiohttp.ClientError, TimeoutError) as e:
                raise AdminCallError(f"{url}: {type(e).__name__}: {e}") from None
        after = await self._held(target, tenant)
        return AbortReport(before=before, after=after, status=status)

    async def _held(self, target: Target, tenant: str) -> PrefillQueues | None:
        """The queue gauges, or None if they cannot be read (the abort goes ahead anyway)."""
        (result,) = await self.metrics.scrape([target], None, tenant)
        return held_requests(result.sample) if result.sample is not None else None


def _auth_hint(status: int) -> str:
    if status in (401, 403):
        return (
            " (the server runs with --api-key or --admin-api-key; /abort_request then needs that "
            "key: a PDRemediationPolicy names it in spec.adminTokenSecretRef, a PDDeployment "
            "does not hold it)"
        )
    return ""
