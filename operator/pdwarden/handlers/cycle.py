"""The remediation daemon's cycle, shared by both kinds: contained, counted, serialized, written.

Why one piece: a PDDeployment's and a PDRemediationPolicy's daemons must behave alike where it
matters during an incident: a failed cycle is logged and counted (pdwarden_operator_errors, by
stage) and the next one runs on time (interval from the spec, the idle interval if it does not
parse); every finished cycle is counted per object (tests wait on that, never on a sleep); and
a cycle's status is written through the guarded store before the remediator forgets its entries.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Generic, Protocol, TypeVar

from prometheus_client import Counter as MetricCounter

from pdwarden import metrics
from pdwarden.api.base import StatusModel
from pdwarden.constants import ANNOTATION_RESET_BREAKER, API_VERSION
from pdwarden.k8s import ApiError
from pdwarden.ports import KubeApi
from pdwarden.remediation.record.store import StatusCache, write

log = logging.getLogger("pdwarden.handlers")
IDLE_INTERVAL = 5.0


class _Interval(Protocol):
    @property
    def scrape_interval_seconds(self) -> float: ...


class _Spec(Protocol):
    @property
    def remediation(self) -> _Interval: ...


S = TypeVar("S", bound=StatusModel)
S_co = TypeVar("S_co", covariant=True)
SpecT = TypeVar("SpecT", bound=_Spec)
SpecT_contra = TypeVar("SpecT_contra", contravariant=True)


class _Result(Protocol[S_co]):
    @property
    def status(self) -> S_co: ...

    @property
    def clear_reset_annotation(self) -> bool: ...


class Remediator(Protocol, Generic[SpecT_contra, S]):
    """What `remediation.cycle.Remediator` and `remediation.policy_cycle.PolicyRemediator` share."""

    async def cycle(
        self, body: Mapping[str, Any], spec: SpecT_contra, previous: S
    ) -> _Result[S]: ...

    def recorded(self, uid: str, status: S) -> None: ...


class DaemonState(Protocol[SpecT_contra, S]):
    """What `deployment.OperatorState` and `policy.PolicyState` share for their daemons."""

    @property
    def client(self) -> KubeApi: ...

    @property
    def statuses(self) -> StatusCache[S]: ...

    @property
    def remediator(self) -> Remediator[SpecT_contra, S]: ...

    @property
    def cycles(self) -> Counter[str]: ...

    def lock_for(self, uid: str) -> asyncio.Lock: ...


def names(body: Mapping[str, Any]) -> tuple[str, str]:
    meta = body["metadata"]
    return str(meta["namespace"]), str(meta["name"])


def interval(body: Mapping[str, Any], parse: Callable[[Mapping[str, Any]], _Spec]) -> float:
    """The scrape interval, even from a spec that does not parse (then the idle interval)."""
    try:
        return float(parse(body.get("spec") or {}).remediation.scrape_interval_seconds)
    except Exception:  # an invalid spec: reported elsewhere (reconcile, the policy's status)
        return IDLE_INTERVAL


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


async def record_cycle(
    client: KubeApi,
    statuses: StatusCache[S],
    remediator: Remediator[SpecT, S],
    body: Mapping[str, Any],
    spec: SpecT,
) -> None:
    """One remediation cycle and its status write; the caller holds the object's lock."""
    uid = str(body["metadata"]["uid"])
    namespace, name = names(body)
    previous = await statuses.current(body)
    result = await remediator.cycle(body, spec, previous.status)
    try:
        known = await write(
            statuses.kind, client, namespace, name, base=previous, new=result.status
        )
    except ApiError:
        metrics.ERRORS.labels("status_write").inc()
        raise  # the entries stay in the remediator's memory; the next cycle writes them
    statuses.remember(uid, known)
    remediator.recorded(uid, known.status)
    if result.clear_reset_annotation:
        await client.patch_metadata(
            API_VERSION, statuses.kind.kind, namespace, name,
            {"annotations": {ANNOTATION_RESET_BREAKER: None}},
        )  # fmt: skip


async def daemon_cycle(
    state: DaemonState[SpecT, S],
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
        spec = spec_of()
        if spec is None:
            if idle is not None:
                await idle()
            return IDLE_INTERVAL
        async with state.lock_for(str(body["metadata"]["uid"])):
            await record_cycle(state.client, state.statuses, state.remediator, body, spec)
        return float(spec.remediation.scrape_interval_seconds)

    return await contained(
        body, run, fallback=lambda: interval(body, parse), stage=stage, what=what,
        cycles=state.cycles, counter=counter,
    )  # fmt: skip
