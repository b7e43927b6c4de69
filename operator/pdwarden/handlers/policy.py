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
from pdwarden.api import PDRemediationPolicyStatus, parse_policy_spec
from pdwarden.constants import ANNOTATION_RESET_BREAKER, API_VERSION, POLICY_KIND
from pdwarden.k8s import ApiError
from pdwarden.ports import ForeignPodApi, KubeApi, WorkerApi
from pdwarden.remediation.act.sglang import PrefillAborter
from pdwarden.remediation.policy_cycle import PolicyRemediator, effective_policy_spec
from pdwarden.remediation.record.store import POLICY, StatusCache, write

log = logging.getLogger("pdwarden.handlers.policy")
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
    statuses: StatusCache[PDRemediationPolicyStatus] = field(init=False)
    remediator: PolicyRemediator = field(init=False)
    # Finished cycles per policy UID: progress a test can wait for before asserting that
    # nothing happened.
    cycles: Counter[str] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        self.statuses = StatusCache(POLICY, self.client)
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
            return IDLE_INTERVAL
        async with state.lock_for(uid):
            previous = await state.statuses.current(body)
            result = await state.remediator.cycle(body, spec, previous.status)
            try:
                known = await write(
                    POLICY, state.client, namespace, name, base=previous, new=result.status
                )
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


def forget_policy(state: PolicyState, body: Mapping[str, Any]) -> None:
    uid = str(body["metadata"]["uid"])
    state.locks.pop(uid, None)
    state.statuses.forget(uid)
    state.cycles.pop(uid, None)
    state.remediator.forget(uid)
    with contextlib.suppress(KeyError):
        metrics.POLICY_CYCLES.remove(*_names(body))
