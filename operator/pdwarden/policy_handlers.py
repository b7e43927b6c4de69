"""What the kopf handlers of PDRemediationPolicy do, as plain async functions (main.py registers).

Why separate from handlers.py: a policy has no reconcile pass, only its remediation daemon, and
its own status model and memory; sharing the process-wide clients is all it needs of the
PDDeployment side. Like there, every pass over one policy is serialized and every error is
contained: a failed cycle is logged and counted (metric pdwarden_operator_errors, stage
"policy_cycle") and the next one runs on time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pdwarden import metrics
from pdwarden.api import InvalidSpec, parse_policy_spec
from pdwarden.constants import ANNOTATION_RESET_BREAKER, API_VERSION, POLICY_KIND
from pdwarden.k8s import ApiError
from pdwarden.k8s.events import post_event
from pdwarden.policy_observe import inactive_status
from pdwarden.policy_status_store import PolicyStatusCache, write
from pdwarden.ports import ForeignPodApi, KubeApi, WorkerApi
from pdwarden.remediate_common import now_utc
from pdwarden.remediate_policy import PolicyRemediator, effective_policy_spec
from pdwarden.sglang_admin import PrefillAborter

log = logging.getLogger("pdwarden.policy_handlers")
IDLE_INTERVAL = 5.0


@dataclass
class PolicyState:
    """Process-wide state of the policy path, kept in kopf's memo next to OperatorState."""

    client: KubeApi
    workers: WorkerApi
    foreign: ForeignPodApi
    global_dry_run: bool = False
    sglang: PrefillAborter | None = None
    locks: dict[str, asyncio.Lock] = field(default_factory=dict)
    statuses: PolicyStatusCache = field(init=False)
    remediator: PolicyRemediator = field(init=False)
    # Finished cycles per policy UID: progress a test can wait for before asserting that
    # nothing happened.
    cycles: Counter[str] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        self.statuses = PolicyStatusCache(self.client)
        self.remediator = PolicyRemediator(self.client, self.workers, self.foreign, self.sglang)

    def lock_for(self, uid: str) -> asyncio.Lock:
        return self.locks.setdefault(uid, asyncio.Lock())


def _names(body: Mapping[str, Any]) -> tuple[str, str]:
    meta = body["metadata"]
    return str(meta["namespace"]), str(meta["name"])


def _interval(body: Mapping[str, Any]) -> float:
    try:
        return float(parse_policy_spec(body.get("spec") or {}).remediation.scrape_interval_seconds)
    except Exception:  # an invalid spec: the API server's schema should have refused it
        return IDLE_INTERVAL


async def policy_cycle(state: PolicyState, body: Mapping[str, Any]) -> float:
    """One cycle of one policy; returns the seconds until the next. Never raises (except
    cancellation)."""
    uid = str(body["metadata"]["uid"])
    namespace, name = _names(body)
    try:
        spec = effective_policy_spec(body, state.global_dry_run)
        if spec is None:
            await report_inactive(state, body)
            return IDLE_INTERVAL
        async with state.lock_for(uid):
            previous = await state.statuses.current(body)
            result = await state.remediator.cycle(body, spec, previous.status)
            try:
                known = await write(state.client, namespace, name, base=previous, new=result.status)
            except ApiError:
                metrics.ERRORS.labels("status_write").inc()
                raise  # the entries stay in the remediator's memory; the next cycle writes them
            state.statuses.remember(uid, known)
            state.remediator.recorded(uid, known.status)
            if result.clear_reset_annotation:
                await state.client.patch_metadata(
                    API_VERSION, POLICY_KIND, namespace, name,
                    {"annotations": {ANNOTATION_RESET_BREAKER: None}},
                )  # fmt: skip
        return float(spec.remediation.scrape_interval_seconds)
    except Exception as e:
        metrics.ERRORS.labels("policy_cycle").inc()
        log.warning(
            "%s/%s: policy cycle failed: %s: %s", namespace, name, type(e).__name__, e,
            exc_info=not isinstance(e, ApiError),
        )  # fmt: skip
        return _interval(body)
    finally:
        state.cycles[uid] += 1
        metrics.POLICY_CYCLES.labels(namespace, name).inc()


async def report_inactive(state: PolicyState, body: Mapping[str, Any]) -> None:
    """Mode Off or an invalid spec: no cycle runs, and the status says which (written only on
    change); an invalid spec also gets a Warning Event when its status first says so."""
    uid = str(body["metadata"]["uid"])
    namespace, name = _names(body)
    try:
        parse_policy_spec(body.get("spec") or {})
        invalid = None
    except InvalidSpec as e:
        invalid = f"invalid spec: {e}"
    async with state.lock_for(uid):
        previous = await state.statuses.current(body)
        status = inactive_status(previous.status, invalid=invalid, now=now_utc(),
                                 generation=body["metadata"].get("generation"))  # fmt: skip
        known = await write(state.client, namespace, name, base=previous, new=status)
        state.statuses.remember(uid, known)
        if invalid is not None and known.status != previous.status:
            await post_event(state.client, dict(body), "InvalidSpec", invalid, "Warning")


def forget_policy(state: PolicyState, body: Mapping[str, Any]) -> None:
    uid = str(body["metadata"]["uid"])
    state.locks.pop(uid, None)
    state.statuses.forget(uid)
    state.cycles.pop(uid, None)
    state.remediator.forget(uid)
    with contextlib.suppress(KeyError):
        metrics.POLICY_CYCLES.remove(*_names(body))
