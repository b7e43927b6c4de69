"""The remediation daemon's cycle, shared by both kinds: contained, counted, serialized, written.

Why one piece: a PDDeployment's and a PDRemediationPolicy's daemons must behave alike where it
matters during an incident: a failed cycle is logged and counted (pdwarden_operator_errors, by
stage) and the next one runs on time (interval from the spec, the idle interval if it does not
parse); every finished cycle is counted per object (tests wait on that, never on a sleep); and
a cycle's status is written through the guarded store before its entries are forgotten.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol, TypeVar

from prometheus_client import Counter as MetricCounter

from pdwarden import metrics
from pdwarden.api import RemediationStatus
from pdwarden.api.base import StatusModel
from pdwarden.api.status import MAX_HISTORY
from pdwarden.constants import ANNOTATION_RESET_BREAKER, API_VERSION
from pdwarden.k8s import ApiError, throttled_budget
from pdwarden.ports import AdminApi, CanaryApi, KubeApi, PairCanaryApi, ScreenApi, WorkerApi
from pdwarden.remediation import cycle
from pdwarden.remediation.act.sglang_abort import PrefillAborter, SGLangAdmin
from pdwarden.remediation.confirm.canary import Canary
from pdwarden.remediation.confirm.pair_canary import PairCanarySender
from pdwarden.remediation.memory import DeploymentMemory
from pdwarden.remediation.record.journal import StatusJournal
from pdwarden.remediation.record.ledger import missing_from
from pdwarden.remediation.record.store import StatusCache, write
from pdwarden.remediation.scrape.worker_client import WorkerClient
from pdwarden.remediation.seams import Kind, Tools

log = logging.getLogger("pdwarden.handlers")
IDLE_INTERVAL = 5.0


class _Interval(Protocol):
    @property
    def scrape_interval_seconds(self) -> float: ...


class _Spec(Protocol):
    @property
    def remediation(self) -> _Interval: ...


S = TypeVar("S", bound=StatusModel)
SpecT = TypeVar("SpecT", bound=_Spec)


class DaemonState(Protocol[S]):
    """What `deployment.OperatorState` and `policy.PolicyState` share for their daemons."""

    @property
    def client(self) -> KubeApi: ...

    @property
    def statuses(self) -> StatusCache[S]: ...

    @property
    def kind(self) -> Kind[Any, S, Any]: ...

    @property
    def tools(self) -> Tools: ...

    @property
    def memory(self) -> dict[str, DeploymentMemory]: ...

    @property
    def cycles(self) -> Counter[str]: ...

    @property
    def gone(self) -> set[str]: ...

    def lock_for(self, uid: str) -> asyncio.Lock: ...


def tools_for(
    client: KubeApi,
    workers: WorkerApi,
    admin: AdminApi,
    sglang: PrefillAborter | None,
    canary: CanaryApi | None,
    *,
    pair: PairCanaryApi | None = None,
    screen: ScreenApi | None = None,
) -> Tools:
    """The clients a kind's cycles act through. The SGLang abort reads gauges through `workers`,
    and the vLLM canary holds a slot of the same per-object shares (`scrape.worker_client`): one
    object's slow pods never take another object's slots. A `workers` that is not the scrape
    client (a test's fake) gets a canary on a client of its own."""
    shares = workers if isinstance(workers, WorkerClient) else WorkerClient()
    return Tools(
        client, workers, admin, sglang or SGLangAdmin(workers), canary or Canary(shares),
        pair=pair or PairCanarySender(shares, workers), screen=screen,
    )  # fmt: skip


def names(body: Mapping[str, Any]) -> tuple[str, str]:
    meta = body["metadata"]
    return str(meta["namespace"]), str(meta["name"])


def interval(body: Mapping[str, Any], parse: Callable[[Mapping[str, Any]], _Spec]) -> float:
    """The scrape interval, even from a spec that does not parse (then the idle interval)."""
    try:
        return float(parse(body.get("spec") or {}).remediation.scrape_interval_seconds)
    except Exception:  # an invalid spec: reported elsewhere (reconcile, the policy's status)
        return IDLE_INTERVAL


async def vanished(client: KubeApi, kind: str, body: Mapping[str, Any]) -> bool:
    """Whether the object `body` stands for is gone: not found, or its name now holds another
    incarnation. Asked after a write for it was answered 404: kopf never hears of an object
    deleted while its watch was down (after 410 Gone it lists again, and a list says what
    exists, not what vanished), so its daemons would run on for it."""
    namespace, name = names(body)
    current = await client.get(API_VERSION, kind, namespace, name)
    return current is None or (current.get("metadata") or {}).get("uid") != body["metadata"]["uid"]


async def contained(
    body: Mapping[str, Any],
    run: Callable[[], Awaitable[float]],
    *,
    fallback: Callable[[], float],
    stage: str,
    what: str,
    cycles: Counter[str],
    counter: MetricCounter,
) -> float:
    """`run()`'s seconds until the next cycle; never raises (except cancellation): a failure is
    counted under `stage`, logged, and the next cycle comes after `fallback()` seconds."""
    uid = str(body["metadata"]["uid"])
    namespace, name = names(body)
    try:
        return await run()
    except Exception as e:
        metrics.ERRORS.labels(stage).inc()
        log.warning(
            "%s/%s: %s failed: %s: %s", namespace, name, what, type(e).__name__, e,
            exc_info=not isinstance(e, ApiError),
        )  # fmt: skip
        return fallback()
    finally:
        cycles[uid] += 1
        counter.labels(namespace, name).inc()


async def record_cycle(state: DaemonState[S], body: Mapping[str, Any], spec: Any) -> None:
    """One remediation cycle and its status write; the caller holds the object's lock. Intents
    are written during the cycle (`record.journal`); this write completes them."""
    uid = str(body["metadata"]["uid"])
    namespace, name = names(body)
    previous = await state.statuses.current(body)
    journal = StatusJournal(state.statuses, state.client, body, previous)
    mem = state.memory.setdefault(uid, DeploymentMemory())
    result = await cycle.run(
        state.kind, state.tools, body, spec, previous.status, mem=mem, journal=journal
    )
    base, new = journal.final(result.status)
    try:
        known = await write(state.statuses.kind, state.client, namespace, name, base=base, new=new)
    except ApiError as e:
        gone = False
        if e.status == 404:
            with contextlib.suppress(ApiError):
                gone = await vanished(state.client, state.statuses.kind.kind, body)
        if gone:
            state.gone.add(uid)
            log.warning("%s/%s: deleted while unwatched; its daemon stops", namespace, name)
            return
        metrics.ERRORS.labels("status_write").inc()
        raise  # the entries stay in memory (mem.unrecorded); the next cycle writes them
    state.statuses.remember(uid, known)
    forget_recorded(mem, known.status)
    if result.clear_reset_annotation:
        await state.client.patch_metadata(
            API_VERSION, state.statuses.kind.kind, namespace, name,
            {"annotations": {ANNOTATION_RESET_BREAKER: None}},
        )  # fmt: skip


def forget_recorded(mem: DeploymentMemory, status: Any) -> None:
    """A status write succeeded: entries it holds no longer need carrying."""
    rem = getattr(status, "remediation", None) or RemediationStatus()
    mem.unrecorded = missing_from(rem.history, mem.unrecorded)[-MAX_HISTORY:]


async def daemon_cycle(
    state: DaemonState[S],
    body: Mapping[str, Any],
    spec_of: Callable[[], SpecT | None],
    *,
    parse: Callable[[Mapping[str, Any]], _Spec],
    stage: str,
    what: str,
    counter: MetricCounter,
    idle: Callable[[], Awaitable[None]] | None = None,
) -> float:
    """One daemon cycle of one object: the spec it runs with (`spec_of()`; None = nothing to do:
    `idle()` reports why, and the next cycle comes after the idle interval), then, under the
    object's lock, `record_cycle`; all of it `contained`. Returns the seconds until the next
    cycle."""

    async def run() -> float:
        if str(body["metadata"]["uid"]) in state.gone:
            return IDLE_INTERVAL  # found deleted: the daemon ends after this call
        spec = spec_of()
        if spec is None:
            if idle is not None:
                await idle()
            return IDLE_INTERVAL
        every = float(spec.remediation.scrape_interval_seconds)
        async with state.lock_for(str(body["metadata"]["uid"])):
            with throttled_budget(every):  # refused writes fail in time for the next cycle
                await record_cycle(state, body, spec)
        return every

    return await contained(
        body, run, fallback=lambda: interval(body, parse), stage=stage, what=what,
        cycles=state.cycles, counter=counter,
    )  # fmt: skip
